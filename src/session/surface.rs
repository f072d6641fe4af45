//! The surface fold (dsh `deriveMessages`): how the four surface kinds build the model history,
//! a list of nodes (the seq of the event that put each message there, and the message). One set
//! of rules (`place`) in two modes. `"append"` adds a node; `{op: "replace", start, end}`
//! (compaction) names the seqs of the first and last node it shadows: both are looked up in the
//! current nodes (`start` must not come after `end`) and that slice becomes the one new node, so
//! a checkpoint at the head may carry `start > end` numerically. `Lenient` is the live session's:
//! an odd `surfaceOp`, or a replacement whose bounds are not current nodes, appends; nothing
//! fails. `Validate` is the session query's: seqs must be contiguous from 0, a surface event needs
//! `"append"` or a replacement whose bounds resolve, a replacement's `sourceEventSeqs` must name
//! every node it shadows (dsh's provenance rule), a log-only event carries neither `surfaceOp`
//! nor `sourceEventSeqs`, and `sourceEventSeqs` is non-empty, without duplicates, and names
//! earlier events; the first violation is the error. In both modes an appended assistant message
//! without content takes no place in the history.
//!
//! A node's message is kept as its event's text (`HistoryMessage`, shared with the resident
//! event, not copied) and parsed when a request is built: a session holds each message once.

use std::sync::OnceLock;

use serde_json::{Value, json};

use super::data::Data;
use super::event::Kind;
use super::record::Event;

/// A message of the model history: the text of the surface event that put it there, shared
/// with that event, parsed afresh by `value`; and its token estimate once asked for.
#[derive(Debug, Clone)]
pub(crate) struct HistoryMessage {
    data: Data,
    /// A `user/message`'s data is its message; the other surface kinds carry it as `message`.
    whole: bool,
    /// `estimate::message_tokens` of the message, made by the first `tokens` (a message never
    /// changes: a compaction replaces history messages, it does not edit them).
    tokens: OnceLock<u64>,
}

impl HistoryMessage {
    /// The message `event` puts into the history (`None` for log-only events).
    pub(crate) fn of(event: &Event) -> Option<HistoryMessage> {
        let whole = match event.kind {
            Kind::UserMessage => true,
            Kind::AssistantMessage | Kind::ToolResult | Kind::SteeringMessage => false,
            _ => return None,
        };
        Some(HistoryMessage { data: event.data.clone(), whole, tokens: OnceLock::new() })
    }

    /// The message's token estimate (`estimate::message_tokens`), parsed for only once.
    pub(crate) fn tokens(&self) -> u64 {
        *self.tokens.get_or_init(|| super::estimate::message_tokens(&self.value()))
    }

    /// The message, parsed (`null` when a carrier has none).
    pub(crate) fn value(&self) -> Value {
        /// The one field of a surface payload the history takes.
        #[derive(serde::Deserialize)]
        struct Carrier {
            #[serde(default)]
            message: Value,
        }
        if self.whole {
            return self.data.to_value();
        }
        self.data.read::<Carrier>().map_or(Value::Null, |c| c.message)
    }
}

/// Equal when the messages are.
impl PartialEq for HistoryMessage {
    fn eq(&self, other: &Self) -> bool {
        self.value() == other.value()
    }
}

/// How strictly the fold reads a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strictness {
    Lenient,
    Validate,
}

/// What one event does to the model history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// A log-only event: no change.
    LogOnly,
    /// A surface event that takes no place (an assistant message without content).
    Skip,
    Append,
    /// Replaces nodes `start..end` (indices into the current nodes) with this event's message.
    Replace {
        start: usize,
        end: usize,
    },
}

/// How a surface event stands in the model-visible history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// A surface event whose message is in the current history.
    Current,
    /// A surface event whose message a later replacement (compaction) removed.
    Shadowed,
    /// Not a surface event.
    LogOnly,
}

impl Surface {
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Current => "current",
            Surface::Shadowed => "shadowed",
            Surface::LogOnly => "log-only",
        }
    }
}

/// The `surfaceOp` of a replacement of the nodes from seq `start` through seq `end`.
pub(crate) fn replace_op(start: u64, end: u64) -> Value {
    json!({"op": "replace", "start": start, "end": end})
}

/// What `event`, the `index`-th event of its log, does to the current nodes (`nodes` holds their
/// seqs, in surface order). Only `Validate` fails.
pub(crate) fn place(event: &Event, index: usize, nodes: &[u64], strictness: Strictness) -> Result<Placement, String> {
    if strictness == Strictness::Validate {
        check_envelope(event, index)?;
    }
    if !event.kind.is_surface() {
        return Ok(Placement::LogOnly);
    }
    let placement = match strictness {
        Strictness::Lenient => lenient_op(event, nodes),
        Strictness::Validate => strict_op(event, nodes)?,
    };
    if placement == Placement::Append && event.kind == Kind::AssistantMessage && empty_assistant_message(event) {
        return Ok(Placement::Skip);
    }
    Ok(placement)
}

/// True when an `assistant/message` carries no content array or an empty one (dsh skips it in
/// the history). Reads the text without building the message.
fn empty_assistant_message(event: &Event) -> bool {
    #[derive(serde::Deserialize)]
    struct Payload {
        #[serde(default)]
        message: Message,
    }
    #[derive(Default, serde::Deserialize)]
    struct Message {
        #[serde(default)]
        content: Vec<serde::de::IgnoredAny>,
    }
    event.data.read::<Payload>().map_or(true, |payload| payload.message.content.is_empty())
}

/// The seq, `sourceEventSeqs` and log-only rules of `Validate`.
fn check_envelope(event: &Event, index: usize) -> Result<(), String> {
    let seq = event.seq;
    if seq != index as u64 {
        return Err(format!("seq {seq} where {index} was expected"));
    }
    if let Some(sources) = &event.source_event_seqs {
        if sources.is_empty() {
            return Err(format!("event {seq} ({}) has an empty sourceEventSeqs", event.kind));
        }
        if let Some(later) = sources.iter().find(|s| **s >= seq) {
            return Err(format!("event {seq} ({}) names a source {later} that is not earlier", event.kind));
        }
        let mut sorted = sources.clone();
        sorted.sort_unstable();
        if let Some(twice) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("event {seq} ({}) names source {} twice", event.kind, twice[0]));
        }
    }
    if !event.kind.is_surface() && (event.surface_op.is_some() || event.source_event_seqs.is_some()) {
        return Err(format!("log-only event {seq} ({}) carries surfaceOp or sourceEventSeqs", event.kind));
    }
    Ok(())
}

/// The `start` and `end` seqs of a replacement op, if `op` is one (each `None` when not a number).
fn replace_bounds(op: Option<&Value>) -> Option<(Option<u64>, Option<u64>)> {
    match op {
        Some(Value::Object(map)) if map.get("op").and_then(Value::as_str) == Some("replace") => {
            Some((map.get("start").and_then(Value::as_u64), map.get("end").and_then(Value::as_u64)))
        }
        _ => None,
    }
}

/// Where the nodes from seq `start` through seq `end` are: their index range in `nodes`.
pub(crate) fn resolve(nodes: &[u64], start: u64, end: u64) -> Result<(usize, usize), String> {
    let find = |seq: u64| {
        nodes.iter().position(|n| *n == seq).ok_or_else(|| format!("surface node {seq} is not in the current surface"))
    };
    let (first, last) = (find(start)?, find(end)?);
    if first > last {
        return Err(format!("surface node {start} comes after surface node {end}"));
    }
    Ok((first, last + 1))
}

/// Checks dsh's provenance rule for a replacement of `nodes[range]`: `sources` names every
/// shadowed node.
pub(crate) fn check_provenance(nodes: &[u64], range: (usize, usize), sources: &[u64]) -> Result<(), String> {
    let missing: Vec<String> =
        nodes[range.0..range.1].iter().filter(|n| !sources.contains(n)).map(u64::to_string).collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "surface replace: sourceEventSeqs must include every shadowed surface node; missing {}",
        missing.join(", ")
    ))
}

/// A replacement whose bounds are current nodes; any other op appends.
fn lenient_op(event: &Event, nodes: &[u64]) -> Placement {
    match replace_bounds(event.surface_op.as_ref()) {
        Some((Some(start), Some(end))) => match resolve(nodes, start, end) {
            Ok((start, end)) => Placement::Replace { start, end },
            Err(_) => Placement::Append,
        },
        _ => Placement::Append,
    }
}

fn strict_op(event: &Event, nodes: &[u64]) -> Result<Placement, String> {
    let seq = event.seq;
    let op =
        event.surface_op.as_ref().ok_or_else(|| format!("surface event {seq} ({}) has no surfaceOp", event.kind))?;
    if *op == "append" {
        return Ok(Placement::Append);
    }
    let Some((start, end)) = replace_bounds(Some(op)) else {
        return Err(format!("surface event {seq} has an invalid surfaceOp {op}"));
    };
    let bound =
        |b: Option<u64>, key: &str| b.ok_or_else(|| format!("event {seq} has a replacement without a numeric {key}"));
    let (start, end) = (bound(start, "start")?, bound(end, "end")?);
    let range = resolve(nodes, start, end).map_err(|e| format!("event {seq} replaces nodes {start}..{end}: {e}"))?;
    check_provenance(nodes, range, event.source_event_seqs.as_deref().unwrap_or_default())
        .map_err(|e| format!("event {seq}: {e}"))?;
    Ok(Placement::Replace { start: range.0, end: range.1 })
}

/// The current surface of a log: each node's seq and message, in surface order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Nodes {
    pub seqs: Vec<u64>,
    pub messages: Vec<HistoryMessage>,
}

impl Nodes {
    /// Applies one event (the live fold; a no-op for log-only events).
    pub(crate) fn apply(&mut self, event: &Event) {
        apply(&mut self.seqs, &mut self.messages, event);
    }

    /// The surface of a whole log, folded leniently.
    pub(crate) fn of(events: &[Event]) -> Nodes {
        let mut nodes = Nodes::default();
        for event in events {
            nodes.apply(event);
        }
        nodes
    }
}

/// Applies one event to the nodes' seqs and messages (the live fold; a no-op for log-only events).
pub(crate) fn apply(seqs: &mut Vec<u64>, messages: &mut Vec<HistoryMessage>, event: &Event) {
    let Some(message) = HistoryMessage::of(event) else {
        return;
    };
    // Lenient placement never fails.
    match place(event, 0, seqs, Strictness::Lenient) {
        Ok(Placement::Append) => {
            seqs.push(event.seq);
            messages.push(message);
        }
        Ok(Placement::Replace { start, end }) => {
            seqs.splice(start..end, [event.seq]);
            messages.splice(start..end, [message]);
        }
        Ok(Placement::LogOnly | Placement::Skip) | Err(_) => {}
    }
}

/// The model history of a log: its surface events folded leniently.
pub fn derive_messages(events: &[Event]) -> Vec<Value> {
    Nodes::of(events).messages.iter().map(HistoryMessage::value).collect()
}

/// The validating fold: each event's surface status, or the first violation.
pub fn validate(events: &[Event]) -> Result<Vec<Surface>, String> {
    let mut surfaces = Vec::with_capacity(events.len());
    // The seq of each current node (seqs are indices here: they are checked contiguous).
    let mut nodes: Vec<u64> = Vec::new();
    for (i, event) in events.iter().enumerate() {
        match place(event, i, &nodes, Strictness::Validate)? {
            Placement::LogOnly => surfaces.push(Surface::LogOnly),
            Placement::Skip => surfaces.push(Surface::Current),
            Placement::Append => {
                surfaces.push(Surface::Current);
                nodes.push(event.seq);
            }
            Placement::Replace { start, end } => {
                surfaces.push(Surface::Current);
                for shadowed in nodes.splice(start..end, [event.seq]) {
                    surfaces[shadowed as usize] = Surface::Shadowed;
                }
            }
        }
    }
    Ok(surfaces)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, kind: &str, surface: Option<Value>, sources: Option<Vec<u64>>) -> Event {
        let data = match kind {
            "assistant/message" => {
                json!({"message": {"role": "assistant", "content": [{"type": "text", "text": format!("a{seq}")}]}})
            }
            _ => json!({"content": [{"type": "text", "text": format!("u{seq}")}]}),
        };
        Event { kind: kind.into(), seq, time: 0, data: data.into(), source_event_seqs: sources, surface_op: surface }
    }

    fn append() -> Option<Value> {
        Some(json!("append"))
    }

    #[test]
    fn replacements_shadow_the_nodes_they_name_by_seq() {
        let events = vec![
            event(0, "user/message", append(), None),
            event(1, "assistant/message", append(), None),
            event(2, "user/message", append(), None),
            event(3, "compact/start", None, None),
            event(4, "user/message", Some(replace_op(0, 1)), Some(vec![3, 0, 1])),
        ];
        let surfaces = validate(&events).unwrap();
        use Surface::{Current, LogOnly, Shadowed};
        assert_eq!(surfaces, [Shadowed, Shadowed, Current, LogOnly, Current]);
        // The live fold agrees: the checkpoint takes the place of the first two nodes.
        let nodes = Nodes::of(&events);
        assert_eq!(nodes.seqs, [4, 2]);
        let messages: Vec<Value> = nodes.messages.iter().map(HistoryMessage::value).collect();
        assert_eq!(messages, [events[4].data.to_value(), events[2].data.to_value()]);
        assert_eq!(nodes.messages[0].data.text().as_ptr(), events[4].data.text().as_ptr(), "shared, not copied");
    }

    #[test]
    fn a_checkpoint_at_the_head_is_merged_by_the_next_one() {
        // The second replacement starts at the first checkpoint (seq 3), which sits before node
        // 2 although its seq is larger: start > end is legal, the positions decide.
        let events = vec![
            event(0, "user/message", append(), None),
            event(1, "user/message", append(), None),
            event(2, "user/message", append(), None),
            event(3, "user/message", Some(replace_op(0, 1)), Some(vec![0, 1])),
            event(4, "user/message", append(), None),
            event(5, "user/message", Some(replace_op(3, 2)), Some(vec![3, 2])),
        ];
        let surfaces = validate(&events).unwrap();
        use Surface::{Current, Shadowed};
        assert_eq!(surfaces, [Shadowed, Shadowed, Shadowed, Shadowed, Current, Current]);
        assert_eq!(Nodes::of(&events).seqs, [5, 4]);
    }

    #[test]
    fn surface_violations_are_named() {
        let missing = vec![event(0, "user/message", None, None)];
        assert!(validate(&missing).unwrap_err().contains("has no surfaceOp"));
        let unknown = vec![event(0, "user/message", Some(replace_op(0, 0)), None)];
        assert!(validate(&unknown).unwrap_err().contains("surface node 0 is not in the current surface"));
        let two = vec![event(0, "user/message", append(), None), event(1, "user/message", append(), None)];
        let reversed = [two.clone(), vec![event(2, "user/message", Some(replace_op(1, 0)), Some(vec![0, 1]))]].concat();
        assert!(validate(&reversed).unwrap_err().contains("surface node 1 comes after surface node 0"));
        let unproven = [two.clone(), vec![event(2, "user/message", Some(replace_op(0, 1)), Some(vec![0]))]].concat();
        assert_eq!(
            validate(&unproven).unwrap_err(),
            "event 2: surface replace: sourceEventSeqs must include every shadowed surface node; missing 1"
        );
        let twice = [two, vec![event(2, "user/message", Some(replace_op(0, 1)), Some(vec![0, 1, 0]))]].concat();
        assert!(validate(&twice).unwrap_err().contains("names source 0 twice"));
        let later = vec![event(0, "assistant/message", append(), Some(vec![0]))];
        assert!(validate(&later).unwrap_err().contains("not earlier"));
        let log_only = vec![event(0, "turn/start", append(), None)];
        assert!(validate(&log_only).unwrap_err().contains("log-only"));
        let gap = vec![event(1, "turn/start", None, None)];
        assert!(validate(&gap).unwrap_err().contains("seq 1 where 0"));
    }

    #[test]
    fn the_live_fold_appends_what_validation_refuses() {
        let events = vec![
            event(0, "user/message", None, None),
            event(1, "user/message", Some(json!("sideways")), None),
            event(2, "user/message", Some(replace_op(1, 9)), None),
        ];
        assert!(validate(&events).is_err());
        assert_eq!(derive_messages(&events), [events[0].data.clone(), events[1].data.clone(), events[2].data.clone()]);
    }

    #[test]
    fn an_assistant_message_without_content_takes_no_place() {
        let mut empty = event(0, "assistant/message", append(), None);
        let mut data = empty.data.to_value();
        data["message"]["content"] = json!([]);
        empty.data = data.into();
        assert_eq!(validate(std::slice::from_ref(&empty)).unwrap(), [Surface::Current]);
        assert!(derive_messages(&[empty]).is_empty());
    }
}
