//! YAML parsing with errors that name the file and line, and limits that refuse hostile input
//! (oversized files, alias bombs) before the parser spends memory on it.

use super::{API_VERSION, Document};
use serde::de::DeserializeOwned;
use std::fmt;

/// Files larger than this are refused before parsing.
pub const MAX_YAML_BYTES: usize = 4 * 1024 * 1024;
/// More anchors/aliases than this in one file is treated as an alias bomb.
const MAX_ALIASES: usize = 64;

/// Where in which file a problem is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Location {
    pub file: String,
    /// 1-based.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
}

impl Location {
    /// The whole file, no line.
    pub fn file(file: &str) -> Location {
        Location { file: file.to_string(), line: None, column: None }
    }

    /// The first line of `text` that sets `key` (`key:` at the start of a line, after indentation
    /// or a list dash); the whole file when none does. Serde does not report positions of valid
    /// values, so semantic findings locate themselves this way.
    pub fn of_key(file: &str, text: &str, key: &str) -> Location {
        let pattern = format!("{key}:");
        let line = text.lines().position(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("- ").map(str::trim_start).unwrap_or(l);
            l.starts_with(&pattern) || l.starts_with(&format!("\"{key}\":"))
        });
        Location { file: file.to_string(), line: line.map(line_number), column: None }
    }

    /// The first line of `text` containing `needle`; the whole file when none does.
    pub fn of_text(file: &str, text: &str, needle: &str) -> Location {
        let line = text.lines().position(|l| l.contains(needle));
        Location { file: file.to_string(), line: line.map(line_number), column: None }
    }
}

/// A 0-based line index as a 1-based line number (files are far below 4 G lines).
fn line_number(index: usize) -> u32 {
    u32::try_from(index + 1).unwrap_or(u32::MAX)
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
            if let Some(c) = self.column {
                write!(f, ":{c}")?;
            }
        }
        Ok(())
    }
}

/// A document that could not be read as what it claims to be.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("{at}: file is {size} bytes, over the {limit}-byte limit")]
    TooLarge { at: Location, size: usize, limit: usize },
    #[error("{at}: {count} YAML anchors/aliases (limit {MAX_ALIASES}); refusing a possible alias bomb")]
    AliasBomb { at: Location, count: usize },
    #[error("{at}: {message}")]
    Syntax { at: Location, message: String },
    #[error("{at}: expected apiVersion {API_VERSION} kind {expected}, found apiVersion {api_version:?} kind {kind:?}")]
    WrongKind { at: Location, expected: String, api_version: String, kind: String },
    #[error("{at}: {message}")]
    Invalid { at: Location, message: String },
}

impl ParseError {
    pub fn location(&self) -> &Location {
        match self {
            ParseError::TooLarge { at, .. }
            | ParseError::AliasBomb { at, .. }
            | ParseError::Syntax { at, .. }
            | ParseError::WrongKind { at, .. }
            | ParseError::Invalid { at, .. } => at,
        }
    }
}

fn at(file: &str) -> Location {
    Location::file(file)
}

/// Refuses input that is too large or alias-heavy, before any parser sees it.
pub fn check_limits(file: &str, text: &str) -> Result<(), ParseError> {
    if text.len() > MAX_YAML_BYTES {
        return Err(ParseError::TooLarge { at: at(file), size: text.len(), limit: MAX_YAML_BYTES });
    }
    // Count `*alias` uses outside of quoted scalars well enough to catch billion-laughs input;
    // legitimate manifests use few or none.
    let count = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.matches(" *").count() + l.matches("[*").count() + l.matches(",*").count())
        .sum::<usize>();
    if count > MAX_ALIASES {
        return Err(ParseError::AliasBomb { at: at(file), count });
    }
    Ok(())
}

fn syntax(file: &str, e: serde_yaml_ng::Error) -> ParseError {
    let (line, column) = match e.location() {
        Some(l) => (u32::try_from(l.line()).ok(), u32::try_from(l.column()).ok()),
        None => (None, None),
    };
    // The location is carried separately; drop the parser's own " at line L column C".
    let mut message = e.to_string();
    if let Some(i) = message.rfind(" at line ")
        && message[i..].contains(" column ")
    {
        message.truncate(i);
    }
    ParseError::Syntax { at: Location { file: file.to_string(), line, column }, message }
}

/// A document's `apiVersion` and `kind` alone (other fields ignored): what it is, read before
/// parsing it whole.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DocumentHead {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
}

/// Parses one YAML document into `T` (unknown fields are errors where `T` says so).
pub fn parse_yaml<T: DeserializeOwned>(file: &str, text: &str) -> Result<T, ParseError> {
    check_limits(file, text)?;
    serde_yaml_ng::from_str(text).map_err(|e| syntax(file, e))
}

/// Parses a fleetgate document and checks its `apiVersion` and `kind`.
pub fn parse_document<S: DeserializeOwned>(file: &str, text: &str, kind: &str) -> Result<Document<S>, ParseError> {
    check_limits(file, text)?;
    let head: DocumentHead = serde_yaml_ng::from_str(text).map_err(|e| syntax(file, e))?;
    if head.api_version != API_VERSION || head.kind != kind {
        return Err(ParseError::WrongKind {
            at: at(file),
            expected: kind.to_string(),
            api_version: head.api_version,
            kind: head.kind,
        });
    }
    serde_yaml_ng::from_str(text).map_err(|e| syntax(file, e))
}

/// Splits a multi-document YAML stream into values, skipping empty documents.
pub fn parse_multi(file: &str, text: &str) -> Result<Vec<serde_yaml_ng::Value>, ParseError> {
    use serde::Deserialize;
    check_limits(file, text)?;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v = serde_yaml_ng::Value::deserialize(doc).map_err(|e| syntax(file, e))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_errors_name_file_and_line() {
        let err = parse_yaml::<serde_yaml_ng::Value>("fleet.yaml", "a: 1\nb: [\n").unwrap_err();
        let loc = err.location();
        assert_eq!(loc.file, "fleet.yaml");
        assert!(loc.line.is_some(), "{err}");
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut text = String::from("a: &a [x, x]\n");
        for i in 0..100 {
            text.push_str(&format!("b{i}: [*a, *a]\n"));
        }
        assert!(matches!(parse_yaml::<serde_yaml_ng::Value>("bomb.yaml", &text), Err(ParseError::AliasBomb { .. })));
    }

    #[test]
    fn oversized_files_are_refused() {
        let text = "x".repeat(MAX_YAML_BYTES + 1);
        assert!(matches!(parse_yaml::<serde_yaml_ng::Value>("big.yaml", &text), Err(ParseError::TooLarge { .. })));
    }

    #[test]
    fn wrong_kind_is_named() {
        let text = "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: a}\nspec: {}\n";
        let err = parse_document::<serde_yaml_ng::Value>("fleet.yaml", text, "Fleet").unwrap_err();
        assert!(err.to_string().contains("kind Fleet"), "{err}");
    }
}
