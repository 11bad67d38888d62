//! Running the commands of a documentation page, so the page cannot drift from the code.
//!
//! [`Page`] reads a Markdown page into prose and fenced blocks, and writes it back unchanged but
//! for the outputs of its `console` blocks ([`Page::bless`]). In a ```` ```console ```` block a
//! line starting with `$ ` is a command (continued on the next line while it ends with `\`), and
//! the lines up to the next command are what it prints, stdout and stderr interleaved.
//!
//! [`Shell`] runs one command or block at a time with `bash`, the way a reader pastes them into
//! one terminal: variables (`FPR=$(…)`, `export GNUPGHOME=…`) and the working directory carry over
//! from one call to the next; nothing else of the test's environment does (a clean environment with
//! its own `HOME`, the built `fleetgate` first on `PATH`).
//!
//! [`normalize`] replaces what differs between two honest runs — commit and object ids, key
//! fingerprints, times, the scratch directory — by placeholders, in the page's text and in the
//! real output alike, before they are compared.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One command of a `console` block and what the page says it prints.
#[derive(Debug, Clone)]
pub struct Shown {
    /// The command as bash reads it (continuation lines included, `$ ` removed).
    pub command: String,
    /// The lines shown after it.
    pub output: Vec<String>,
}

/// A fenced block other than `console`: its info string (e.g. `sh`), its lines, and the text of an
/// HTML comment `<!-- test: TEXT -->` on the last line before it, which tells a test how to run
/// it (invisible where the page is rendered).
#[derive(Debug, Clone)]
pub struct Fenced {
    pub info: String,
    pub lines: Vec<String>,
    pub marker: Option<String>,
}

impl Fenced {
    pub fn text(&self) -> String {
        self.lines.join("\n")
    }
}

#[derive(Debug, Clone)]
enum Part {
    Prose(String),
    Console(Vec<Shown>),
    Fenced(Fenced),
}

/// A Markdown page split into prose and fenced blocks.
#[derive(Debug, Clone)]
pub struct Page {
    path: PathBuf,
    parts: Vec<Part>,
}

impl Page {
    /// Reads `path` (relative to the checkout).
    pub fn read(path: &str) -> Page {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Page { parts: parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())), path }
    }

    /// Every command of every `console` block, in page order.
    pub fn console(&self) -> Vec<&Shown> {
        self.parts.iter().filter_map(|p| if let Part::Console(c) = p { Some(c) } else { None }).flatten().collect()
    }

    /// Every other fenced block whose info string is `info`, in page order.
    pub fn fenced(&self, info: &str) -> Vec<&Fenced> {
        self.parts
            .iter()
            .filter_map(|p| if let Part::Fenced(f) = p { Some(f) } else { None })
            .filter(|f| f.info == info)
            .collect()
    }

    /// Writes the page back with `outputs` (one per [`console`](Self::console) command, in order)
    /// in place of the shown outputs.
    pub fn bless(&self, outputs: &[String]) {
        let mut outputs = outputs.iter();
        let mut text = String::new();
        for part in &self.parts {
            match part {
                Part::Prose(p) => text.push_str(p),
                Part::Fenced(f) => {
                    text.push_str(&format!("```{}\n", f.info));
                    f.lines.iter().for_each(|l| text.push_str(&format!("{l}\n")));
                    text.push_str("```\n");
                }
                Part::Console(commands) => {
                    text.push_str("```console\n");
                    for c in commands {
                        text.push_str(&format!("$ {}\n", c.command));
                        let out = outputs.next().expect("an output for every command");
                        out.lines().for_each(|l| text.push_str(&format!("{}\n", l.trim_end())));
                    }
                    text.push_str("```\n");
                }
            }
        }
        std::fs::write(&self.path, text).unwrap();
    }
}

fn parse(text: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut prose = String::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let Some(info) = line.strip_prefix("```").filter(|i| !i.is_empty()) else {
            prose.push_str(line);
            prose.push('\n');
            continue;
        };
        let marker = prose
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix("<!-- test:")?.strip_suffix("-->"))
            .map(|m| m.trim().to_string());
        parts.push(Part::Prose(std::mem::take(&mut prose)));
        let mut body = Vec::new();
        loop {
            let (_, l) = lines.next().ok_or(format!("line {}: the block is not closed", n + 1))?;
            if l == "```" {
                break;
            }
            body.push(l.to_string());
        }
        if info != "console" {
            parts.push(Part::Fenced(Fenced { info: info.to_string(), lines: body, marker }));
            continue;
        }
        let mut commands: Vec<Shown> = Vec::new();
        let mut continued = false;
        for l in body {
            if continued {
                let c = commands.last_mut().expect("continuing a command");
                c.command.push('\n');
                c.command.push_str(&l);
                continued = l.ends_with('\\');
            } else if let Some(command) = l.strip_prefix("$ ") {
                continued = command.ends_with('\\');
                commands.push(Shown { command: command.to_string(), output: Vec::new() });
            } else {
                let c = commands.last_mut().ok_or(format!("line {}: output before any `$ ` command", n + 1))?;
                c.output.push(l);
            }
        }
        parts.push(Part::Console(commands));
    }
    parts.push(Part::Prose(prose));
    Ok(parts)
}

/// What a command printed (stdout and stderr, interleaved as a terminal shows them) and its exit
/// code.
#[derive(Debug)]
pub struct Ran {
    pub code: i32,
    pub output: String,
}

/// A bash session in a scratch directory; see the module doc.
pub struct Shell {
    dir: tempfile::TempDir,
    state: PathBuf,
    extra_path: Vec<PathBuf>,
    env: Vec<(String, String)>,
}

impl Shell {
    /// A session in a fresh directory under /tmp (short: a GNUPGHOME inside it holds gpg-agent's
    /// socket, whose path is limited to about 108 bytes), with the built `fleetgate` on `PATH`.
    pub fn new() -> Shell {
        let dir = tempfile::Builder::new().prefix("fgdoc").tempdir_in("/tmp").unwrap();
        let state = dir.path().join(".shell-state");
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        std::fs::create_dir_all(dir.path().join("work")).unwrap();
        let fleetgate = Path::new(env!("CARGO_BIN_EXE_fleetgate")).parent().unwrap().to_path_buf();
        Shell { dir, state, extra_path: vec![fleetgate], env: Vec::new() }
    }

    /// Where the commands run (their first working directory).
    pub fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// Puts `dir` on `PATH` (after what is there already, before the system's).
    pub fn path_prepend(&mut self, dir: &Path) {
        self.extra_path.push(dir.to_path_buf());
    }

    /// Sets an environment variable for every later command.
    pub fn set_env(&mut self, name: &str, value: &str) {
        self.env.push((name.to_string(), value.to_string()));
    }

    /// Runs `script` (one command or a whole block) after the state the previous calls left, and
    /// keeps the state it leaves. Every variable it assigns is exported (`set -a`), so the next
    /// call sees it.
    pub fn run(&self, script: &str) -> Ran {
        let wrapper = format!(
            "cd \"$FGDOC_WORK\"\n[ -f \"$FGDOC_STATE\" ] && . \"$FGDOC_STATE\" && cd \"$FGDOC_CWD\"\nexec 2>&1\nset -a\n{script}\n\
             fgdoc_status=$?\nset +a\nFGDOC_CWD=$PWD\nexport -p > \"$FGDOC_STATE\"\nexit $fgdoc_status\n"
        );
        let system_path = std::env::var("PATH").unwrap_or_default();
        let mut path: Vec<String> = self.extra_path.iter().map(|p| p.display().to_string()).collect();
        path.push(system_path);
        let out = Command::new("bash")
            .arg("-c")
            .arg(wrapper)
            .env_clear()
            .env("PATH", path.join(":"))
            .env("HOME", self.dir.path().join("home"))
            .env("LANG", "C.UTF-8")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("FGDOC_WORK", self.work())
            .env("FGDOC_CWD", self.work())
            .env("FGDOC_STATE", &self.state)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .expect("running bash");
        Ran { code: out.status.code().unwrap_or(-1), output: String::from_utf8_lossy(&out.stdout).into_owned() }
    }

    /// [`run`](Self::run), which must exit 0 (else panics with what it printed).
    pub fn ok(&self, script: &str) -> String {
        let ran = self.run(script);
        assert_eq!(ran.code, 0, "exit code {} of:\n{script}\nwhich printed:\n{}", ran.code, ran.output);
        ran.output
    }

    /// `normalize` with this session's directory.
    pub fn normalize(&self, text: &str) -> String {
        normalize(text, self.dir.path())
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        // The page's gpg (a GNUPGHOME inside the scratch directory) leaves a gpg-agent running.
        let _ = self.run("[ -z \"${GNUPGHOME:-}\" ] || gpgconf --kill all");
    }
}

/// `text` with ids and places that differ between runs replaced: `dir` by `[DIR]`, RFC 3339 times
/// by `[TIME]`, OpenPGP fingerprints and key ids (16–40 upper-case hex digits) by `[KEY]`, Git
/// object ids, full or abbreviated (7–40 lower-case hex digits, not right after a `-` as the date
/// in `rel-20250315-001` is), by `[HASH]`; trailing blanks of each line and of the text dropped.
pub fn normalize(text: &str, dir: &Path) -> String {
    use regex::Regex;
    use std::sync::LazyLock;
    static TIME: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?").unwrap());
    static KEY: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b[0-9A-F]{16,40}\b").unwrap());
    static HASH: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(^|[^-0-9a-zA-Z])[0-9a-f]{7,40}\b").unwrap());
    let text = text.replace(&dir.display().to_string(), "[DIR]");
    let text = TIME.replace_all(&text, "[TIME]");
    let text = KEY.replace_all(&text, "[KEY]");
    let text = HASH.replace_all(&text, "${1}[HASH]");
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    lines.join("\n").trim_end().to_string()
}
