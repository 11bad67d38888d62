//! Reading status notes: the `Deserialize` of [`Status`] and [`StatusNote`], written by hand.
//!
//! Both keep the fields of newer writers (`extra`), which the derived form did with
//! `#[serde(flatten)]`. Flatten makes serde buffer every entry into an intermediate tree of
//! owned values and deserialize again from that; with 20,000 notes that was most of
//! `fleetgate status`'s time (docs/BENCHMARKS.md, "Status matrix"). Here each key is matched
//! straight from the input (no allocation for a known key), known fields are read once into their
//! own types, and only unknown fields are kept as JSON values. What is accepted is unchanged:
//! the same required fields, the same types, an error for a known field given twice, and
//! [`State::Unknown`] for a state this build does not know.

use super::model::{GateFigure, State, Status, StatusNote};
use crate::model::ApprovalRecord;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;

/// A key of a note or an entry: one of the names this build knows, or another kept in `extra`.
enum Key<K> {
    Known(K),
    Other(String),
}

/// Matches a key against `names` without allocating; only an unknown key is copied.
struct KeyVisitor<K: 'static>(&'static [(&'static str, K)]);

impl<'de, K: Copy + 'static> Visitor<'de> for KeyVisitor<K> {
    type Value = Key<K>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key<K>, E> {
        Ok(match self.0.iter().find(|(name, _)| *name == key) {
            Some((_, k)) => Key::Known(*k),
            None => Key::Other(key.to_string()),
        })
    }
}

/// `next_key` for a map whose known keys are `names`.
fn next_key<'de, A: MapAccess<'de>, K: Copy + 'static>(
    map: &mut A,
    names: &'static [(&'static str, K)],
) -> Result<Option<Key<K>>, A::Error> {
    struct Seed<K: 'static>(&'static [(&'static str, K)]);
    impl<'de, K: Copy + 'static> de::DeserializeSeed<'de> for Seed<K> {
        type Value = Key<K>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key<K>, D::Error> {
            d.deserialize_identifier(KeyVisitor(self.0))
        }
    }
    map.next_key_seed(Seed(names))
}

/// Stores a known field's value, refusing a second one: two `state`s in one entry must not mean
/// one thing to this reader and another to a different JSON parser.
fn once<T, E: de::Error>(slot: &mut Option<T>, value: T, name: &'static str) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(name));
    }
    *slot = Some(value);
    Ok(())
}

fn required<T, E: de::Error>(slot: Option<T>, name: &'static str) -> Result<T, E> {
    slot.ok_or_else(|| E::missing_field(name))
}

#[derive(Clone, Copy)]
enum Field {
    Cluster,
    State,
    Description,
    Release,
    Commit,
    Gates,
    StartedAt,
    AppliedAt,
    DecidedAt,
    RollbackTo,
    Approval,
    Variant,
    TargetUrl,
    AgentVersion,
    ReportedAt,
    Fleet,
    Sequence,
    Signature,
}

const STATUS_FIELDS: &[(&str, Field)] = &[
    ("cluster", Field::Cluster),
    ("state", Field::State),
    ("description", Field::Description),
    ("release", Field::Release),
    ("commit", Field::Commit),
    ("gates", Field::Gates),
    ("startedAt", Field::StartedAt),
    ("appliedAt", Field::AppliedAt),
    ("decidedAt", Field::DecidedAt),
    ("rollbackTo", Field::RollbackTo),
    ("approval", Field::Approval),
    ("variant", Field::Variant),
    ("targetUrl", Field::TargetUrl),
    ("agentVersion", Field::AgentVersion),
    ("reportedAt", Field::ReportedAt),
    ("fleet", Field::Fleet),
    ("sequence", Field::Sequence),
    ("signature", Field::Signature),
];

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Status, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Status;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fleetgate status entry")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Status, A::Error> {
                let mut cluster: Option<String> = None;
                let mut state: Option<State> = None;
                let mut description: Option<String> = None;
                let mut release: Option<String> = None;
                let mut commit: Option<String> = None;
                let mut gates: Option<Vec<GateFigure>> = None;
                // Optional fields: the outer Option says whether the key was given.
                let mut started_at: Option<Option<DateTime<Utc>>> = None;
                let mut applied_at: Option<Option<DateTime<Utc>>> = None;
                let mut decided_at: Option<Option<DateTime<Utc>>> = None;
                let mut rollback_to: Option<Option<String>> = None;
                let mut approval: Option<Option<ApprovalRecord>> = None;
                let mut variant: Option<Option<String>> = None;
                let mut target_url: Option<Option<String>> = None;
                let mut agent_version: Option<String> = None;
                let mut reported_at: Option<DateTime<Utc>> = None;
                let mut fleet: Option<Option<String>> = None;
                let mut sequence: Option<Option<u64>> = None;
                let mut signature: Option<Option<String>> = None;
                let mut extra = BTreeMap::new();
                while let Some(key) = next_key(&mut map, STATUS_FIELDS)? {
                    match key {
                        Key::Known(Field::Cluster) => once(&mut cluster, map.next_value()?, "cluster")?,
                        Key::Known(Field::State) => once(&mut state, map.next_value()?, "state")?,
                        Key::Known(Field::Description) => once(&mut description, map.next_value()?, "description")?,
                        Key::Known(Field::Release) => once(&mut release, map.next_value()?, "release")?,
                        Key::Known(Field::Commit) => once(&mut commit, map.next_value()?, "commit")?,
                        Key::Known(Field::Gates) => once(&mut gates, map.next_value()?, "gates")?,
                        Key::Known(Field::StartedAt) => once(&mut started_at, map.next_value()?, "startedAt")?,
                        Key::Known(Field::AppliedAt) => once(&mut applied_at, map.next_value()?, "appliedAt")?,
                        Key::Known(Field::DecidedAt) => once(&mut decided_at, map.next_value()?, "decidedAt")?,
                        Key::Known(Field::RollbackTo) => once(&mut rollback_to, map.next_value()?, "rollbackTo")?,
                        Key::Known(Field::Approval) => once(&mut approval, map.next_value()?, "approval")?,
                        Key::Known(Field::Variant) => once(&mut variant, map.next_value()?, "variant")?,
                        Key::Known(Field::TargetUrl) => once(&mut target_url, map.next_value()?, "targetUrl")?,
                        Key::Known(Field::AgentVersion) => once(&mut agent_version, map.next_value()?, "agentVersion")?,
                        Key::Known(Field::ReportedAt) => once(&mut reported_at, map.next_value()?, "reportedAt")?,
                        Key::Known(Field::Fleet) => once(&mut fleet, map.next_value()?, "fleet")?,
                        Key::Known(Field::Sequence) => once(&mut sequence, map.next_value()?, "sequence")?,
                        Key::Known(Field::Signature) => once(&mut signature, map.next_value()?, "signature")?,
                        Key::Other(name) => {
                            extra.insert(name, map.next_value()?);
                        }
                    }
                }
                Ok(Status {
                    cluster: required(cluster, "cluster")?,
                    state: required(state, "state")?,
                    description: required(description, "description")?,
                    release: required(release, "release")?,
                    commit: required(commit, "commit")?,
                    gates: gates.unwrap_or_default(),
                    started_at: started_at.flatten(),
                    applied_at: applied_at.flatten(),
                    decided_at: decided_at.flatten(),
                    rollback_to: rollback_to.flatten(),
                    approval: approval.flatten(),
                    variant: variant.flatten(),
                    target_url: target_url.flatten(),
                    agent_version: agent_version.unwrap_or_default(),
                    reported_at: required(reported_at, "reportedAt")?,
                    fleet: fleet.flatten(),
                    sequence: sequence.flatten(),
                    signature: signature.flatten(),
                    extra,
                })
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Clone, Copy)]
enum NoteField {
    Schema,
    Context,
    Entries,
}

const NOTE_FIELDS: &[(&str, NoteField)] =
    &[("schema", NoteField::Schema), ("context", NoteField::Context), ("entries", NoteField::Entries)];

impl<'de> Deserialize<'de> for StatusNote {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StatusNote, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StatusNote;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fleetgate status note")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StatusNote, A::Error> {
                let mut schema = None;
                let mut context = None;
                let mut entries = None;
                let mut extra = BTreeMap::new();
                while let Some(key) = next_key(&mut map, NOTE_FIELDS)? {
                    match key {
                        Key::Known(NoteField::Schema) => once(&mut schema, map.next_value()?, "schema")?,
                        Key::Known(NoteField::Context) => once(&mut context, map.next_value()?, "context")?,
                        Key::Known(NoteField::Entries) => once(&mut entries, map.next_value()?, "entries")?,
                        Key::Other(name) => {
                            extra.insert(name, map.next_value()?);
                        }
                    }
                }
                Ok(StatusNote {
                    schema: required(schema, "schema")?,
                    context: required(context, "context")?,
                    entries: required(entries, "entries")?,
                    extra,
                })
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{StatusKeys, StatusSigner};

    const ENTRY: &str = r#"{"cluster":"a","state":"success","description":"d","release":"r","commit":"c",
        "reportedAt":"2025-03-15T10:00:00Z"}"#;

    fn with(field: &str) -> String {
        ENTRY.replacen('{', &format!("{{{field},"), 1)
    }

    #[test]
    fn every_field_round_trips() {
        let at = |s: &str| Some(s.parse::<DateTime<Utc>>().unwrap());
        let mut s = Status::new("a", "rel-2", "c".repeat(40), State::Failure, "rolled back")
            .with_gates(vec![GateFigure {
                name: "error-rate".into(),
                observed: "7 %".into(),
                threshold: "5 %".into(),
                verdict: "fail".into(),
            }])
            .rolled_back_to("rel-1")
            .of_variant(Some("eu".into()))
            .with_target_url("https://example.com/x");
        (s.started_at, s.applied_at, s.decided_at) =
            (at("2025-01-01T00:00:00Z"), at("2025-01-01T00:01:00Z"), at("2025-01-01T00:11:00Z"));
        (s.fleet, s.sequence, s.signature) = (Some("f".into()), Some(9), Some("sig".into()));
        s.extra.insert("later".into(), serde_json::json!({"x": [1, null]}));
        let mut note = StatusNote::new("a");
        note.entries.push(s);
        note.extra.insert("noteLevel".into(), serde_json::json!(true));
        assert_eq!(StatusNote::parse(&note.to_text()).unwrap(), note);
    }

    /// A newer writer's entry: a state and fields this build does not know, at both levels. It is
    /// read, keeps them, and (the fields not being signed) still verifies.
    #[test]
    fn a_newer_writers_note_is_read_and_still_verifies() {
        let signer = StatusSigner::generate("a").unwrap();
        let mut entry = Status::new("a", "rel-1", "c".repeat(40), State::Success, "ok");
        signer.sign(&mut entry, "f", 1).unwrap();
        let mut v = serde_json::to_value(&entry).unwrap();
        v["canaryScore"] = serde_json::json!({"value": 0.97, "window": ["5m", null]});
        v["zz"] = serde_json::Value::Null;
        let text = serde_json::json!({"schema": 2, "context": "fleetgate/a", "writer": "fleetgate 9", "entries": [v]});
        let note = StatusNote::parse(&text.to_string()).unwrap();
        let read = &note.entries[0];
        assert_eq!(read.extra["canaryScore"]["window"][0], "5m");
        assert_eq!(read.extra["zz"], serde_json::Value::Null);
        assert_eq!(note.extra["writer"], "fleetgate 9");
        let mut keys = StatusKeys::new("f");
        keys.insert("a", signer.public());
        assert_eq!(keys.verify("a", &"c".repeat(40), read), Ok(()));

        let later = with(r#""state":"paused","rolloutRing":3"#).replacen(r#","state":"success""#, "", 1);
        let read: Status = serde_json::from_str(&later).unwrap();
        assert_eq!(read.state, State::Unknown);
        assert_eq!(read.extra["rolloutRing"], 3);
    }

    #[test]
    fn absent_optional_fields_and_nulls_are_none() {
        let s: Status = serde_json::from_str(&with(r#""rollbackTo":null,"sequence":null"#)).unwrap();
        assert_eq!((s.rollback_to, s.sequence, s.signature, s.gates.len()), (None, None, None, 0));
        assert_eq!(s.agent_version, "");
    }

    #[test]
    fn malformed_entries_and_notes_are_refused() {
        let cases = [
            (ENTRY.replacen(r#""reportedAt""#, r#""reportedOn""#, 1), "missing field `reportedAt`"),
            (ENTRY.replacen(r#""cluster":"a","#, "", 1), "missing field `cluster`"),
            (with(r#""state":"failure""#), "duplicate field `state`"),
            (with(r#""sequence":"7""#), "invalid type"),
            (ENTRY.replacen("2025-03-15T10:00:00Z", "yesterday", 1), "input contains invalid characters"),
            (with(r#""gates":{"name":"g"}"#), "invalid type"),
            ("[]".to_string(), "invalid type"),
            (ENTRY[..40].to_string(), "EOF"),
        ];
        for (text, why) in cases {
            let err = serde_json::from_str::<Status>(&text).unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
        for (text, why) in [
            (r#"{"context":"fleetgate/a","entries":[]}"#.to_string(), "missing field `schema`"),
            (r#"{"schema":2,"schema":1,"context":"fleetgate/a","entries":[]}"#.to_string(), "duplicate field `schema`"),
            (format!(r#"{{"schema":2,"context":"fleetgate/a","entries":[{ENTRY},{{"cluster":1}}]}}"#), "invalid type"),
            ("not json".to_string(), "expected"),
        ] {
            let err = StatusNote::parse(&text).unwrap_err();
            assert!(matches!(err, crate::status::NoteParseError::Json(_)), "{text}: {err}");
            assert!(crate::model::error_chain(&err).contains(why), "{text}: {}", crate::model::error_chain(&err));
        }
    }
}
