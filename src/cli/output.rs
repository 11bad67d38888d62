//! Output shared by every command: the `-o` format and printing a serializable value as JSON/YAML.

use serde::Serialize;

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
                print!("{}", serde_yaml_ng::to_string(value)?);
                Ok(true)
            }
        }
    }
}

/// True when stdout is a terminal that should get colours (and `NO_COLOR` is not set).
pub fn colours() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none() && std::io::stdout().is_terminal()
}
