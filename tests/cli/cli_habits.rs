//! The command-line habits people bring from kubectl and flux: shell completion loaded by the real
//! shells (bash always; zsh and fish where installed, skipped with a message otherwise), and
//! `fleetgate version` with the agents' versions read from their signed statuses in a fleet repo
//! served by `git daemon`.

use crate::status_support;

use std::process::{Command, Output};

fn fleetgate() -> &'static str {
    env!("CARGO_BIN_EXE_fleetgate")
}

fn shell(shell: &str, script: &str) -> Option<Output> {
    match Command::new(shell).args(["-c", script]).env("FLEETGATE", fleetgate()).output() {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("SKIPPED: {shell} is not installed (`make deps-test` installs it)");
            None
        }
        Err(e) => panic!("{shell}: {e}"),
    }
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn bash_loads_the_completion_and_completes_commands_and_flags() {
    let script = r#"source <("$FLEETGATE" completion bash) || exit 1
complete -p fleetgate
COMP_WORDS=(fleetgate sta); COMP_CWORD=1; COMP_LINE="fleetgate sta"; COMP_POINT=${#COMP_LINE}
_fleetgate fleetgate sta fleetgate; echo "commands: ${COMPREPLY[*]}"
COMP_WORDS=(fleetgate status -o ""); COMP_CWORD=3; COMP_LINE="fleetgate status -o "; COMP_POINT=${#COMP_LINE}
_fleetgate fleetgate "" -o; echo "formats: ${COMPREPLY[*]}""#;
    let out = shell("bash", script).expect("bash is always there");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("-F _fleetgate fleetgate"), "{t}");
    assert!(t.contains("commands: status"), "{t}");
    for format in ["table", "wide", "json", "yaml", "html"] {
        assert!(t.lines().any(|l| l.starts_with("formats:") && l.contains(format)), "{format}: {t}");
    }
}

#[test]
fn zsh_and_fish_load_the_completion() {
    let zsh = r#"autoload -Uz compinit && compinit -u -D && source <("$FLEETGATE" completion zsh) && print -r -- "registered: $_comps[fleetgate]""#;
    if let Some(out) = shell("zsh", zsh) {
        assert!(text(&out).contains("registered: _fleetgate"), "{}", text(&out));
    }
    let fish = r#""$FLEETGATE" completion fish | source; and complete -C "fleetgate sta"; and complete -C "fleetgate status --commit""#;
    if let Some(out) = shell("fish", fish) {
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        assert!(t.lines().any(|l| l.starts_with("status")), "{t}");
        assert!(t.contains("--commit-url-template"), "{t}");
    }
}

#[test]
fn version_shows_the_client_and_each_agents_last_report() {
    let out = Command::new(fleetgate()).args(["version", "-o", "json"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["client"]["version"], fleetgate::VERSION);
    assert!(v.get("agents").is_none(), "no repo, no agents: {v}");

    let f = status_support::fleet();
    let out = Command::new(fleetgate()).args(["version", "--repo", &f.url, "-o", "json"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let agents = v["agents"].as_array().unwrap();
    let names: Vec<&str> = agents.iter().map(|a| a["cluster"].as_str().unwrap()).collect();
    assert_eq!(names, ["cluster-a", "cluster-b", "cluster-c", "cluster-d"]);
    // cluster-a reported on NEW last; cluster-c only on OLD.
    assert_eq!(
        (agents[0]["version"].as_str(), agents[0]["release"].as_str()),
        (Some(fleetgate::VERSION), Some(status_support::NEW))
    );
    assert_eq!(agents[2]["release"], status_support::OLD);

    let table = Command::new(fleetgate()).args(["version", "--repo", &f.url]).env("NO_COLOR", "1").output().unwrap();
    let t = text(&table);
    assert!(t.starts_with(&format!("client  fleetgate {}", fleetgate::VERSION)), "{t}");
    assert!(t.contains("CLUSTER    AGENT"), "{t}");
}
