//! Session log records: the header line, the event envelope and packed chunk rows of the
//! dsh-compatible JSONL format (`protocol/session-log.md`). The event bodies are `event`'s.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chunk::StreamChunk;
use super::data::Data;
use super::event::{AssistantChunk, Kind};

/// The only header version readers accept (dsh `SESSION_FORMAT_VERSION`).
pub(crate) const SESSION_FORMAT_VERSION: u64 = 0;

/// Line 0 of every log: immutable storage metadata of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionHeader {
    /// `"session"` in every header kin accepts, held without an allocation of its own
    /// (thousands of headers are read at a start).
    #[serde(rename = "type", deserialize_with = "header_type")]
    pub tag: Cow<'static, str>,
    pub version: u64,
    pub id: String,
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_length: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    #[serde(default)]
    pub delegation_depth: u64,
}

/// The `type` of a header line: the static `"session"` for the one kin accepts.
fn header_type<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Cow<'static, str>, D::Error> {
    struct Tag;
    impl serde::de::Visitor<'_> for Tag {
        type Value = Cow<'static, str>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, tag: &str) -> Result<Self::Value, E> {
            Ok(SessionHeader::tag_of(tag))
        }
    }
    deserializer.deserialize_str(Tag)
}

impl SessionHeader {
    /// The `type` `tag` as a header holds it.
    pub(crate) fn tag_of(tag: &str) -> Cow<'static, str> {
        if tag == "session" { Cow::Borrowed("session") } else { Cow::Owned(tag.to_string()) }
    }

    /// A fresh top-level header.
    pub fn new(id: impl Into<String>, created_at: u64, cwd: Option<String>) -> Self {
        SessionHeader {
            tag: "session".into(),
            version: SESSION_FORMAT_VERSION,
            id: id.into(),
            created_at,
            cwd,
            parent_session: None,
            seed_length: None,
            origin: None,
            delegation_depth: 0,
        }
    }

    /// Parses and validates a header line.
    pub fn parse(line: &str) -> Result<Self, String> {
        let header: SessionHeader = serde_json::from_str(line).map_err(|e| format!("invalid session header: {e}"))?;
        header.validated()
    }

    /// This header, if it is one `parse` accepts (its type and format version).
    pub(crate) fn validated(self) -> Result<Self, String> {
        let header = self;
        if header.tag != "session" {
            return Err(format!("invalid session header: type is {:?}, expected \"session\"", header.tag));
        }
        if header.version != SESSION_FORMAT_VERSION {
            return Err(format!(
                "unsupported session format version {} (this kin reads version {SESSION_FORMAT_VERSION})",
                header.version
            ));
        }
        Ok(header)
    }
}

/// One event: `{type, seq, time, data, sourceEventSeqs?, surfaceOp?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: Kind,
    pub seq: u64,
    pub time: u64,
    /// The payload's JSON text as read or written (`Data`: parsed on demand).
    pub data: Data,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_event_seqs: Option<Vec<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface_op: Option<Value>,
}

/// A packed run of `assistant/chunk` delta events (`text-chunks`, `reasoning-chunks`,
/// `tool-call-chunks`). Member `i` has seq `seq0 + i` and time `time0 + sum(dt[..i])`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PackedRow {
    #[serde(rename = "type")]
    pub kind: String,
    pub seq0: u64,
    pub time0: u64,
    pub data: PackedData,
}

/// Payload of a packed row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackedData {
    pub turn: u64,
    pub step: u64,
    pub index: u64,
    pub dt: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub texts: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
}

/// One line of a log after the header.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Event(Event),
    Packed(PackedRow),
}

impl Record {
    /// Parses one log line (not the header).
    pub fn parse(line: &str) -> Result<Record, String> {
        // Fast path: almost every line is a plain event; parse it in one pass.
        if let Ok(event) = serde_json::from_str::<Event>(line)
            && !matches!(event.kind.as_str(), "session" | "text-chunks" | "reasoning-chunks" | "tool-call-chunks")
        {
            return Ok(Record::Event(event));
        }
        let value: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
        let kind = value.get("type").and_then(Value::as_str).unwrap_or("");
        let record = match kind {
            "text-chunks" | "reasoning-chunks" | "tool-call-chunks" => {
                Record::Packed(serde_json::from_value(value).map_err(|e| format!("invalid packed row: {e}"))?)
            }
            "" => return Err("record has no string \"type\"".into()),
            "session" => return Err("a second session header inside the log".into()),
            _ => Record::Event(serde_json::from_str(line).map_err(|e| format!("invalid event: {e}"))?),
        };
        if let Record::Packed(row) = &record {
            row.check()?;
        }
        Ok(record)
    }

    /// Serializes the record as one JSON line (without the newline).
    pub fn to_line(&self) -> String {
        let result = match self {
            Record::Event(event) => serde_json::to_string(event),
            Record::Packed(row) => serde_json::to_string(row),
        };
        result.unwrap_or_else(|e| unreachable_json(&e))
    }

    /// The events this record stands for, in seq order.
    pub fn into_events(self) -> Vec<Event> {
        match self {
            Record::Event(event) => vec![event],
            Record::Packed(row) => row.unpack(),
        }
    }
}

impl Event {
    /// Appends the event's line (and its newline) to `out`, without copying the event.
    pub(super) fn write_line(&self, out: &mut Vec<u8>) {
        let start = out.len();
        if let Err(e) = serde_json::to_writer(&mut *out, self) {
            out.truncate(start);
            out.extend_from_slice(unreachable_json(&e).as_bytes());
        }
        out.push(b'\n');
    }
}

fn unreachable_json(e: &serde_json::Error) -> String {
    // Serializing plain structs of JSON values cannot fail; keep a visible trace if it ever does.
    tracing::error!("serializing a session record failed: {e}");
    String::from("{}")
}

impl PackedRow {
    fn members(&self) -> usize {
        match self.kind.as_str() {
            "tool-call-chunks" => self.data.args.as_ref().map_or(0, Vec::len),
            _ => self.data.texts.as_ref().map_or(0, Vec::len),
        }
    }

    fn check(&self) -> Result<(), String> {
        let members = self.members();
        if members == 0 {
            return Err(format!("{} row has no members", self.kind));
        }
        if self.data.dt.len() + 1 != members {
            return Err(format!(
                "{} row has {} members but {} time gaps (expected {})",
                self.kind,
                members,
                self.data.dt.len(),
                members - 1
            ));
        }
        if self.kind == "tool-call-chunks" && self.data.id.is_none() {
            return Err("tool-call-chunks row has no id".into());
        }
        if self.data.dt.iter().try_fold(self.time0, |time, &gap| time.checked_add(gap)).is_none() {
            return Err(format!(
                "{} row's times run past the largest time (time0 {} plus its gaps)",
                self.kind, self.time0
            ));
        }
        if self.seq0.checked_add(members as u64 - 1).is_none() {
            return Err(format!("{} row's seqs run past the largest seq (seq0 {})", self.kind, self.seq0));
        }
        Ok(())
    }

    /// Expands the row into its `assistant/chunk` events.
    pub fn unpack(self) -> Vec<Event> {
        let PackedData { turn, step, index, dt, texts, id, name, args } = self.data;
        let mut time = self.time0;
        let mut out = Vec::new();
        let pieces = match self.kind.as_str() {
            "tool-call-chunks" => args.unwrap_or_default(),
            _ => texts.unwrap_or_default(),
        };
        for (i, piece) in pieces.into_iter().enumerate() {
            if i > 0 {
                // `check` refused a row whose times overflow.
                time = time.saturating_add(dt.get(i - 1).copied().unwrap_or(0));
            }
            let chunk = match self.kind.as_str() {
                "text-chunks" => StreamChunk::TextDelta { index, text: piece },
                "reasoning-chunks" => StreamChunk::ReasoningDelta { index, text: piece },
                _ => StreamChunk::ToolCallDelta {
                    index,
                    id: id.clone().unwrap_or_default(),
                    name: if i == 0 { name.clone() } else { None },
                    arguments_delta: piece,
                },
            };
            out.push(Event::new(self.seq0.saturating_add(i as u64), time, AssistantChunk { turn, step, chunk }, None));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header's `type` is held without an allocation of its own when it is `"session"`, read
    /// by serde or by kin's own reader; any other is kept as read, and refused by name.
    #[test]
    fn the_session_type_is_held_without_an_allocation_and_another_is_refused_by_name() {
        let line = serde_json::to_string(&SessionHeader::new("a", 1, Some("/w".into()))).unwrap();
        let by_serde: SessionHeader = serde_json::from_str(&line).unwrap();
        let by_kin = super::super::canonical::header(&mut super::super::canonical::Cursor::new(&line)).unwrap();
        for header in [by_serde, by_kin] {
            assert!(matches!(header.tag, Cow::Borrowed("session")), "{:?}", header.tag);
        }
        let other = line.replace("\"session\"", "\"sessions\"");
        let read: SessionHeader = serde_json::from_str(&other).unwrap();
        assert!(matches!(&read.tag, Cow::Owned(tag) if tag == "sessions"));
        let refused = SessionHeader::parse(&other).unwrap_err();
        assert_eq!(refused, "invalid session header: type is \"sessions\", expected \"session\"");
    }

    #[test]
    fn packed_text_row_unpacks_with_times_and_seqs() {
        let line = r#"{"type":"text-chunks","seq0":27,"time0":100,"data":{"turn":1,"step":1,"index":1,"dt":[2,3],"texts":["CH","ILD","_OK"]}}"#;
        let events = Record::parse(line).unwrap().into_events();
        assert_eq!(events.len(), 3);
        assert_eq!(events[2].seq, 29);
        assert_eq!(events[2].time, 105);
        assert_eq!(events[1].data["chunk"]["text"], "ILD");
        assert_eq!(events[0].data["chunk"]["type"], "text-delta");
    }

    #[test]
    fn packed_tool_call_row_carries_name_on_first_member_only() {
        let line = r#"{"type":"tool-call-chunks","seq0":5,"time0":0,"data":{"turn":1,"step":1,"index":1,"dt":[0],"id":"c1","name":"read","args":["{","}"]}}"#;
        let events = Record::parse(line).unwrap().into_events();
        assert_eq!(events[0].data["chunk"]["name"], "read");
        assert!(events[1].data["chunk"].get("name").is_none());
        assert_eq!(events[1].data["chunk"]["argumentsDelta"], "}");
        let first = r#"{"type":"assistant/chunk","seq":5,"time":0,"data":{"turn":1,"step":1,"chunk":{"type":"tool-call-delta","index":1,"id":"c1","name":"read","argumentsDelta":"{"}}}"#;
        assert_eq!(Record::Event(events[0].clone()).to_line(), first, "a member is the event it stands for");
    }

    #[test]
    fn packed_row_with_wrong_gap_count_is_rejected() {
        let line = r#"{"type":"text-chunks","seq0":0,"time0":0,"data":{"turn":1,"step":1,"index":0,"dt":[],"texts":["a","b"]}}"#;
        assert!(Record::parse(line).unwrap_err().contains("time gaps"));
    }

    #[test]
    fn packed_rows_whose_times_or_seqs_overflow_are_rejected_not_unpacked() {
        let max = u64::MAX;
        let big_start = format!(
            r#"{{"type":"text-chunks","seq0":0,"time0":{max},"data":{{"turn":1,"step":1,"index":0,"dt":[1],"texts":["a","b"]}}}}"#
        );
        assert!(Record::parse(&big_start).unwrap_err().contains("times run past"));
        let big_gap = format!(
            r#"{{"type":"text-chunks","seq0":0,"time0":5,"data":{{"turn":1,"step":1,"index":0,"dt":[0,{max}],"texts":["a","b","c"]}}}}"#
        );
        assert!(Record::parse(&big_gap).unwrap_err().contains("times run past"));
        let big_seq = format!(
            r#"{{"type":"text-chunks","seq0":{max},"time0":0,"data":{{"turn":1,"step":1,"index":0,"dt":[0],"texts":["a","b"]}}}}"#
        );
        assert!(Record::parse(&big_seq).unwrap_err().contains("seqs run past"));
    }

    #[test]
    fn header_rejects_other_versions_and_tags() {
        let v1 = r#"{"type":"session","version":1,"id":"a","createdAt":0,"delegationDepth":0}"#;
        assert!(SessionHeader::parse(v1).unwrap_err().contains("version 1"));
        let wrong = r#"{"type":"turn/start","version":0,"id":"a","createdAt":0}"#;
        assert!(SessionHeader::parse(wrong).is_err());
        let missing_depth = r#"{"type":"session","version":0,"id":"a","createdAt":0}"#;
        assert_eq!(SessionHeader::parse(missing_depth).unwrap().delegation_depth, 0);
    }

    #[test]
    fn unknown_event_types_are_kept() {
        let line = r#"{"type":"future/thing","seq":3,"time":1,"data":{"x":[1,2]}}"#;
        let record = Record::parse(line).unwrap();
        assert_eq!(record.to_line(), line);
    }
}
