//! YAML parsing with errors that name the file and line, and limits that refuse hostile input
//! (oversized files, alias bombs) before the parser spends memory on it.
//!
//! Alias bombs are found from the YAML parser's own events (`yaml-rust2`'s event parser, which
//! never builds a tree), never by scanning text: `*emphasis*` and `&` in a CRD's markdown
//! descriptions are text, not aliases. What is limited is what an alias costs — the nodes it
//! would expand to — so a billion-laughs file is refused after one linear pass, while a CRD of a
//! megabyte without anchors passes whatever its descriptions say.

use super::{API_VERSION, Document};
use serde::de::DeserializeOwned;
use std::fmt;

/// Files larger than this are refused before parsing. Upstream operators publish everything in
/// one file: prometheus-operator's `bundle.yaml` (v0.85) is 4.05 MiB.
pub const MAX_YAML_BYTES: usize = 8 * 1024 * 1024;
/// Nodes that aliases of one file may add when expanded; more is treated as an alias bomb.
/// Legitimate manifests use few aliases, each expanding to a small block.
pub const MAX_ALIAS_EXPANSION: u64 = 100_000;
/// Aliases in one file; more is refused whatever they expand to.
const MAX_ALIASES: usize = 10_000;

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
    #[error(
        "{at}: {aliases} YAML aliases would expand to {expanded} more nodes (limits: {MAX_ALIASES} aliases, {MAX_ALIAS_EXPANSION} nodes); refusing an alias bomb"
    )]
    AliasBomb { at: Location, aliases: usize, expanded: u64 },
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

/// Refuses input that is too large or whose aliases expand too far, before any parser builds it.
fn check_limits(file: &str, text: &str) -> Result<(), ParseError> {
    if text.len() > MAX_YAML_BYTES {
        return Err(ParseError::TooLarge { at: at(file), size: text.len(), limit: MAX_YAML_BYTES });
    }
    let cost = alias_cost(text);
    if cost.aliases > MAX_ALIASES || cost.expanded > MAX_ALIAS_EXPANSION {
        let at = Location { file: file.to_string(), line: cost.line, column: None };
        return Err(ParseError::AliasBomb { at, aliases: cost.aliases, expanded: cost.expanded });
    }
    Ok(())
}

/// What the aliases of a YAML stream cost when expanded.
#[derive(Debug, Default, PartialEq, Eq)]
struct AliasCost {
    aliases: usize,
    /// Nodes the aliases add (saturating: a bomb's true figure overflows any integer).
    expanded: u64,
    /// Where the expansion first went over the limit (or the last alias when it did not).
    line: Option<u32>,
}

/// Walks the parser's events once, keeping the expanded size of every anchored node, and adds
/// up what each alias expands to. Input the event parser cannot read costs nothing here: the
/// document parser then reports the syntax error (and has a repetition limit of its own).
fn alias_cost(text: &str) -> AliasCost {
    use yaml_rust2::parser::{Event, Parser};
    let mut cost = AliasCost::default();
    let mut anchors: std::collections::HashMap<usize, u64> = std::collections::HashMap::new();
    // Open collections: (anchor id, expanded node count so far).
    let mut open: Vec<(usize, u64)> = Vec::new();
    let mut parser = Parser::new_from_str(text);
    let add = |open: &mut Vec<(usize, u64)>, n: u64| {
        if let Some(top) = open.last_mut() {
            top.1 = top.1.saturating_add(n);
        }
    };
    loop {
        let Ok((event, mark)) = parser.next_token() else { return cost };
        match event {
            Event::StreamEnd => return cost,
            Event::Scalar(_, _, anchor, _) => {
                if anchor > 0 {
                    anchors.insert(anchor, 1);
                }
                add(&mut open, 1);
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => open.push((anchor, 1)),
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((anchor, size)) = open.pop() {
                    if anchor > 0 {
                        anchors.insert(anchor, size);
                    }
                    add(&mut open, size);
                }
            }
            Event::Alias(anchor) => {
                let size = anchors.get(&anchor).copied().unwrap_or(1);
                cost.aliases += 1;
                cost.expanded = cost.expanded.saturating_add(size);
                if cost.line.is_none() || cost.expanded <= MAX_ALIAS_EXPANSION {
                    cost.line = u32::try_from(mark.line()).ok();
                }
                add(&mut open, size);
                if cost.expanded > MAX_ALIAS_EXPANSION || cost.aliases > MAX_ALIASES {
                    return cost;
                }
            }
            _ => {}
        }
    }
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

    /// Billion laughs: `levels` anchors, each a list of ten aliases of the one before.
    fn laughs(levels: usize) -> String {
        let mut text = String::from("l0: &l0 lol\n");
        for i in 1..=levels {
            let refs = vec![format!("*l{}", i - 1); 10].join(", ");
            text.push_str(&format!("l{i}: &l{i} [{refs}]\n"));
        }
        text
    }

    #[test]
    fn alias_bombs_are_refused_at_once() {
        let started = std::time::Instant::now();
        let err = parse_yaml::<serde_yaml_ng::Value>("bomb.yaml", &laughs(9)).unwrap_err();
        assert!(matches!(err, ParseError::AliasBomb { .. }), "{err}");
        assert!(err.to_string().starts_with("bomb.yaml:"), "{err}");
        // One linear pass over a few hundred bytes, not an expansion to 10^9 nodes.
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[test]
    fn a_few_small_aliases_are_fine() {
        let mut text = String::from("base: &base {a: 1, b: 2}\n");
        for i in 0..100 {
            text.push_str(&format!("c{i}: *base\n"));
        }
        // Each alias adds the mapping and its four scalars.
        assert_eq!(alias_cost(&text), AliasCost { aliases: 100, expanded: 500, line: Some(101) });
        assert!(parse_yaml::<serde_yaml_ng::Value>("ok.yaml", &text).is_ok());
        // l1 = 1 + 10 × 1 nodes, l2 = 1 + 10 × 11, l3 = 1 + 10 × 111: its aliases add 10 + 110 + 1110.
        assert_eq!(alias_cost(&laughs(3)).expanded, 10 + 110 + 1110);
    }

    #[test]
    fn markdown_in_descriptions_is_not_an_alias() {
        // What a real CRD's descriptions hold: emphasis, lists, ampersands, in every scalar style.
        let mut text = String::from("spec:\n  versions:\n");
        for i in 0..500 {
            text.push_str(&format!(
                "  - name: v{i}\n    description: \"*Required* & see *note*: a [*list*] & more, *x*\"\n    plain: use *this* & *that*\n    block: |\n      * item one & *two*\n      &anchor-looking text *alias-looking*\n"
            ));
        }
        assert_eq!(alias_cost(&text).aliases, 0);
        assert!(parse_yaml::<serde_yaml_ng::Value>("crd.yaml", &text).is_ok());
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
