//! YAML parsing with errors that name the file and line, and limits that refuse hostile input
//! (oversized files, alias bombs) before the parser spends memory on it.
//!
//! One parser reads every YAML file: serde-saphyr, which kube already links for kubeconfigs. Its
//! budget counts the parser's own events, never text: `*emphasis*` and `&` in a CRD's markdown
//! descriptions are text, not aliases. What is limited is what aliases cost — the events they
//! replay when expanded — so a billion-laughs file is refused after a bounded amount of work,
//! while a CRD of a megabyte without anchors passes whatever its descriptions say.
//!
//! Scalars resolve as YAML 1.2's core schema, as before: `yes`/`no`/`on`/`off` are strings, not
//! booleans, and `0755` or `1_000` stay strings where a value's type is inferred (manifests).

use super::{API_VERSION, Document};
use serde::de::DeserializeOwned;
use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::granit_parser::{Event, Parser};
use serde_saphyr::{DefaultMessageFormatter, Error as YamlError, MessageFormatter, NonFiniteFloatPolicy, Options};
use std::fmt;

/// Files larger than this are refused before parsing. Upstream operators publish everything in
/// one file: prometheus-operator's `bundle.yaml` (v0.85) is 4.05 MiB.
pub const MAX_YAML_BYTES: usize = 8 * 1024 * 1024;
/// Parser events that aliases of one file may replay when expanded (a scalar is one event, a
/// collection two plus its contents); more is treated as an alias bomb. Legitimate manifests use
/// few aliases, each expanding to a small block.
pub const MAX_ALIAS_EXPANSION: u64 = 100_000;
/// Aliases in one file; more is refused whatever they expand to.
const MAX_ALIASES: usize = 10_000;
/// How deep mappings and sequences may nest (serde-saphyr's default, 64, is below what
/// generated CRD schemas reach).
const MAX_DEPTH: usize = 128;

/// The parser's options: the limits above, and YAML 1.2 scalars.
fn options() -> Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_aliases: MAX_ALIASES,
            // Aliases are judged by what they expand to (below), not by their count per anchor:
            // a hundred `*base` of one small `&base` is fine.
            enforce_alias_anchor_ratio: false,
            // Without aliases a file holds at most about one event per byte; MAX_YAML_BYTES
            // bounds these, so only the byte limit and the alias limits refuse real files.
            max_events: MAX_YAML_BYTES,
            max_nodes: MAX_YAML_BYTES,
            max_documents: MAX_YAML_BYTES,
            max_depth: MAX_DEPTH,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: usize::try_from(MAX_ALIAS_EXPANSION).unwrap_or(usize::MAX),
        },
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        non_finite_float_policy: NonFiniteFloatPolicy::AsString,
        with_snippet: false,
    }
}

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

    /// The first mapping key `key` in `text`, at any depth; the whole file when there is none.
    /// Serde does not report positions of valid values, so semantic findings locate themselves
    /// from the parser's events: a `key:` inside a description or a comment is not a key.
    pub fn of_key(file: &str, text: &str, key: &str) -> Location {
        Location::of_path(file, text, &[key])
    }

    /// The first node whose path from its document's root ends with `path`: mapping keys, and
    /// sequence indices as decimal numbers (`["spec", "waves", "2"]` is the third wave,
    /// `["images", "1", "tag"]` the second image's `tag` key). So a key that repeats (`tag` of
    /// every image) is found where the finding means it. The whole file when none matches; no
    /// column, as findings name lines.
    pub fn of_path(file: &str, text: &str, path: &[&str]) -> Location {
        Location { file: file.to_string(), line: node_line(text, path), column: None }
    }

    /// The first line of `text` containing `needle`; the whole file when none does. For values
    /// found in text the parser does not type (an image reference anywhere in a manifest).
    pub fn of_text(file: &str, text: &str, needle: &str) -> Location {
        let line = text.lines().position(|l| l.contains(needle)).and_then(|i| u32::try_from(i + 1).ok());
        Location { file: file.to_string(), line, column: None }
    }
}

/// The 1-based line of the first node whose path ends with `path` (see [`Location::of_path`]):
/// a mapping key where the path's last part is a key, a sequence entry where it is an index.
/// Input the parser cannot read has no lines to offer.
fn node_line(text: &str, path: &[&str]) -> Option<u32> {
    /// An open collection: a mapping (whether its next node is a key) or a sequence (its next index).
    enum Open {
        Mapping { at_key: bool },
        Sequence { next: usize },
    }
    // The path to the node being read: the keys and indices that lead to it.
    let mut here: Vec<String> = Vec::new();
    let mut open: Vec<Open> = Vec::new();
    let ends_with = |here: &[String]| {
        !path.is_empty()
            && here.len() >= path.len()
            && here[here.len() - path.len()..].iter().zip(path).all(|(h, p)| h == p)
    };
    for event in Parser::new_from_str(text) {
        let (event, span) = event.ok()?;
        let line = || u32::try_from(span.start.line()).ok();
        // A node begins: it takes its place in the parent (a key's place lasts until its value ends).
        let is_key = matches!(open.last(), Some(Open::Mapping { at_key: true }));
        let is_node =
            matches!(event, Event::Scalar(..) | Event::Alias(_) | Event::MappingStart(..) | Event::SequenceStart(..));
        if is_node {
            match open.last_mut() {
                Some(Open::Mapping { at_key: true }) => {
                    let key = match &event {
                        Event::Scalar(value, ..) => value.to_string(),
                        // An alias or a collection as a key: no name to match.
                        _ => String::new(),
                    };
                    here.push(key);
                }
                Some(Open::Sequence { next }) => here.push(next.to_string()),
                _ => {}
            }
            if (is_key || matches!(open.last(), Some(Open::Sequence { .. }))) && ends_with(&here) {
                return line();
            }
        }
        match event {
            Event::DocumentStart(..) => {
                here.clear();
                open.clear();
                continue;
            }
            Event::MappingStart(..) => {
                open.push(Open::Mapping { at_key: true });
                continue;
            }
            Event::SequenceStart(..) => {
                open.push(Open::Sequence { next: 0 });
                continue;
            }
            Event::MappingEnd | Event::SequenceEnd => {
                open.pop();
            }
            Event::Scalar(..) | Event::Alias(_) => {}
            _ => continue,
        }
        // A node ended: it leaves its place.
        match open.last_mut() {
            Some(Open::Mapping { at_key }) => {
                if !*at_key {
                    here.pop();
                }
                *at_key = !*at_key;
            }
            Some(Open::Sequence { next }) => {
                here.pop();
                *next += 1;
            }
            None => {}
        }
    }
    None
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
        "{at}: YAML aliases expand too far (limits: {MAX_ALIASES} aliases, {MAX_ALIAS_EXPANSION} replayed events): {what}; refusing an alias bomb"
    )]
    AliasBomb { at: Location, what: String },
    /// Over another of the parser's budgets (nesting depth, events, documents).
    #[error("{at}: {what}")]
    Limit { at: Location, what: String },
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
            | ParseError::Limit { at, .. }
            | ParseError::Syntax { at, .. }
            | ParseError::WrongKind { at, .. }
            | ParseError::Invalid { at, .. } => at,
        }
    }
}

fn at(file: &str) -> Location {
    Location::file(file)
}

/// Refuses input too large to parse at all; the parser's budget does the rest as it reads.
fn check_size(file: &str, text: &str) -> Result<(), ParseError> {
    if text.len() > MAX_YAML_BYTES {
        return Err(ParseError::TooLarge { at: at(file), size: text.len(), limit: MAX_YAML_BYTES });
    }
    Ok(())
}

/// The parser's error as ours: where (its line and column), and what, sorting the alias and
/// budget limits from plain syntax and schema errors.
fn refusal(file: &str, e: &YamlError) -> ParseError {
    let position = e.location().filter(|l| l.line() > 0);
    let at = Location {
        file: file.to_string(),
        line: position.and_then(|l| u32::try_from(l.line()).ok()),
        column: position.and_then(|l| u32::try_from(l.column()).ok()),
    };
    // The error itself, without the wrappers that carry an alias's other location.
    let mut inner = e;
    while let YamlError::AliasError { error, .. } | YamlError::WithSnippet { error, .. } = inner {
        inner = error;
    }
    // The message without the parser's own " at line L, column C": the location is carried apart.
    let what = DefaultMessageFormatter.format_message(inner).into_owned();
    match inner {
        YamlError::AliasReplayLimitExceeded { .. }
        | YamlError::AliasExpansionLimitExceeded { .. }
        | YamlError::AliasReplayStackDepthExceeded { .. }
        | YamlError::AliasReplayCounterOverflow { .. }
        | YamlError::Budget {
            breach:
                BudgetBreach::Aliases { .. }
                | BudgetBreach::Anchors { .. }
                | BudgetBreach::AliasAnchorRatio { .. }
                | BudgetBreach::RecordedAnchorEvents { .. }
                | BudgetBreach::RecordedAnchorBytes { .. }
                | BudgetBreach::MergeKeys { .. },
            ..
        } => ParseError::AliasBomb { at, what },
        YamlError::Budget { .. } => ParseError::Limit { at, what },
        _ => ParseError::Syntax { at, message: what },
    }
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
    check_size(file, text)?;
    serde_saphyr::from_str_with_options(text, options()).map_err(|e| refusal(file, &e))
}

/// Parses a fleetgate document and checks its `apiVersion` and `kind`.
pub fn parse_document<S: DeserializeOwned>(file: &str, text: &str, kind: &str) -> Result<Document<S>, ParseError> {
    let head: DocumentHead = parse_yaml(file, text)?;
    if head.api_version != API_VERSION || head.kind != kind {
        return Err(ParseError::WrongKind {
            at: at(file),
            expected: kind.to_string(),
            api_version: head.api_version,
            kind: head.kind,
        });
    }
    parse_yaml(file, text)
}

/// Splits a multi-document YAML stream into values, skipping empty documents. Values are JSON's:
/// what Kubernetes reads, keys as strings.
pub fn parse_multi(file: &str, text: &str) -> Result<Vec<serde_json::Value>, ParseError> {
    check_size(file, text)?;
    serde_saphyr::from_multiple_with_options(text, options()).map_err(|e| refusal(file, &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeMap;

    #[test]
    fn syntax_errors_name_file_and_line() {
        let err = parse_yaml::<Value>("fleet.yaml", "a: 1\nb: [\n").unwrap_err();
        let loc = err.location();
        assert_eq!(loc.file, "fleet.yaml");
        assert!(loc.line.is_some(), "{err}");
        assert!(!err.to_string().contains(" at line "), "the location is said once: {err}");
    }

    #[test]
    fn schema_errors_name_the_line_of_the_value() {
        let err = parse_yaml::<BTreeMap<String, u32>>("s.yaml", "a: 1\nb: two\n").unwrap_err();
        assert_eq!(err.location().line, Some(2), "{err}");
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
        let err = parse_yaml::<Value>("bomb.yaml", &laughs(9)).unwrap_err();
        assert!(matches!(err, ParseError::AliasBomb { .. }), "{err}");
        assert!(err.to_string().starts_with("bomb.yaml:"), "{err}");
        // Refused after MAX_ALIAS_EXPANSION replayed events, not an expansion to 10^9 nodes.
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        // Also where the document is only skipped, and in a stream of documents.
        assert!(matches!(
            parse_yaml::<DocumentHead>("bomb.yaml", &laughs(9)),
            Ok(_) | Err(ParseError::AliasBomb { .. })
        ));
        assert!(matches!(parse_multi("bomb.yaml", &laughs(9)), Err(ParseError::AliasBomb { .. })));
    }

    #[test]
    fn a_few_small_aliases_are_fine() {
        let mut text = String::from("base: &base {a: 1, b: 2}\n");
        for i in 0..100 {
            text.push_str(&format!("c{i}: *base\n"));
        }
        let v = parse_yaml::<Value>("ok.yaml", &text).unwrap();
        assert_eq!(v["c99"]["b"], 2);
        // l3 expands to 1 + 10 × 11 × 10 scalars: well under the limit.
        assert!(parse_yaml::<Value>("ok.yaml", &laughs(3)).is_ok());
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
        assert!(parse_yaml::<Value>("crd.yaml", &text).is_ok());
    }

    #[test]
    fn oversized_files_are_refused() {
        let text = "x".repeat(MAX_YAML_BYTES + 1);
        assert!(matches!(parse_yaml::<Value>("big.yaml", &text), Err(ParseError::TooLarge { .. })));
    }

    #[test]
    fn wrong_kind_is_named() {
        let text = "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: a}\nspec: {}\n";
        let err = parse_document::<Value>("fleet.yaml", text, "Fleet").unwrap_err();
        assert!(err.to_string().contains("kind Fleet"), "{err}");
    }

    #[test]
    fn scalars_are_yaml_1_2() {
        let v: Value = parse_yaml("v.yaml", "a: yes\nb: off\nc: 0755\nd: 1_000\ne: true\nf: 0x1F\ng: ~\n").unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": "yes", "b": "off", "c": "0755", "d": "1_000", "e": true, "f": 31, "g": null})
        );
        assert!(parse_yaml::<BTreeMap<String, bool>>("b.yaml", "b: yes\n").is_err(), "`yes` is not a boolean");
    }

    #[test]
    fn streams_skip_empty_documents() {
        let docs = parse_multi("m.yaml", "---\na: 1\n---\n---\n# only a comment\n---\nb: 2\n").unwrap();
        assert_eq!(docs, [serde_json::json!({"a": 1}), serde_json::json!({"b": 2})]);
        assert_eq!(parse_multi("m.yaml", "").unwrap(), Vec::<Value>::new());
        let err = parse_multi("m.yaml", "a: 1\n---\nb: [\n").unwrap_err();
        assert!(err.location().line.is_some_and(|l| l >= 3), "{err}");
    }

    #[test]
    fn keys_are_found_by_the_parser_not_the_text() {
        let text = "metadata:\n  name: a\n  description: |\n    name: not a key\nspec:\n  # tag: a comment\n  image: {repository: r, tag: v1}\n  images:\n  - name: w\n    tag: v2\n  - name: x\n    tag: v3\n";
        let line = |path: &[&str]| Location::of_path("r.yaml", text, path).line;
        assert_eq!(line(&["name"]), Some(2));
        assert_eq!(line(&["tag"]), Some(7));
        assert_eq!(line(&["images", "1", "tag"]), Some(12));
        assert_eq!(line(&["spec", "images", "0", "tag"]), Some(10));
        assert_eq!(line(&["images", "1"]), Some(11), "a sequence entry");
        assert_eq!(line(&["nothing"]), None);
    }
}
