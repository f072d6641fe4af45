//! The surface fold (dsh `deriveMessages`): how the four surface kinds build the model history.
//! One set of rules (`place`) in two modes. `Lenient` is the live session's: an odd `surfaceOp`
//! appends, a replacement range is clamped, nothing fails. `Validate` is the session query's:
//! seqs must be contiguous from 0, a surface event needs `"append"` or `{op: "replace", start,
//! end}` with `start <= end <=` the history's length, a log-only event carries neither
//! `surfaceOp` nor `sourceEventSeqs`, and `sourceEventSeqs` is non-empty and names earlier
//! events; the first violation is the error. In both modes an assistant message without content
//! takes no place in the history.

use serde_json::Value;

use super::event::Kind;
use super::record::Event;

/// How strictly the fold reads a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    Lenient,
    Validate,
}

/// What one event does to the model history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A log-only event: no change.
    LogOnly,
    /// A surface event that takes no place (an assistant message without content).
    Skip,
    Append,
    /// Replaces messages `start..end` with this event's message (compaction).
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

/// What `event`, the `index`-th event of its log, does to a history of `len` messages. Only
/// `Validate` fails.
pub fn place(event: &Event, index: usize, len: usize, strictness: Strictness) -> Result<Placement, String> {
    if strictness == Strictness::Validate {
        check_envelope(event, index)?;
    }
    if !event.kind.is_surface() {
        return Ok(Placement::LogOnly);
    }
    let placement = match strictness {
        Strictness::Lenient => lenient_op(event.surface_op.as_ref(), len),
        Strictness::Validate => strict_op(event, len)?,
    };
    let empty = || event.data["message"]["content"].as_array().is_none_or(Vec::is_empty);
    if event.kind == Kind::AssistantMessage && empty() {
        return Ok(Placement::Skip);
    }
    Ok(placement)
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
    }
    if !event.kind.is_surface() && (event.surface_op.is_some() || event.source_event_seqs.is_some()) {
        return Err(format!("log-only event {seq} ({}) carries surfaceOp or sourceEventSeqs", event.kind));
    }
    Ok(())
}

/// A replacement with its range clamped to the history (a missing bound is its end); any other
/// op appends.
fn lenient_op(op: Option<&Value>, len: usize) -> Placement {
    match op {
        Some(Value::Object(op)) if op.get("op").and_then(Value::as_str) == Some("replace") => {
            let bound = |key: &str| op.get(key).and_then(Value::as_u64).map_or(len, |b| (b as usize).min(len));
            let start = bound("start");
            Placement::Replace { start, end: bound("end").max(start) }
        }
        _ => Placement::Append,
    }
}

fn strict_op(event: &Event, len: usize) -> Result<Placement, String> {
    let seq = event.seq;
    let op =
        event.surface_op.as_ref().ok_or_else(|| format!("surface event {seq} ({}) has no surfaceOp", event.kind))?;
    match op {
        Value::String(s) if s == "append" => Ok(Placement::Append),
        Value::Object(map) if map.get("op").and_then(Value::as_str) == Some("replace") => {
            let bound = |key: &str| {
                map.get(key)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| format!("event {seq} has a replacement without a numeric {key}"))
            };
            let (start, end) = (bound("start")?, bound("end")?);
            if start > end || end > len as u64 {
                return Err(format!("event {seq} replaces messages {start}..{end} of a history of {len}"));
            }
            Ok(Placement::Replace { start: start as usize, end: end as usize })
        }
        other => Err(format!("surface event {seq} has an invalid surfaceOp {other}")),
    }
}

/// Applies one event to a history of model messages (the live fold; a no-op for log-only events).
pub fn apply(messages: &mut Vec<Value>, event: &Event) {
    let Some(message) = event.surface_message() else {
        return;
    };
    // Lenient placement never fails.
    match place(event, 0, messages.len(), Strictness::Lenient) {
        Ok(Placement::Append) => messages.push(message.clone()),
        Ok(Placement::Replace { start, end }) => {
            messages.splice(start..end, [message.clone()]);
        }
        Ok(Placement::LogOnly | Placement::Skip) | Err(_) => {}
    }
}

/// The model history of a log: its surface events folded leniently.
pub fn derive_messages(events: &[Event]) -> Vec<Value> {
    let mut messages = Vec::new();
    for event in events {
        apply(&mut messages, event);
    }
    messages
}

/// The validating fold: each event's surface status, or the first violation.
pub fn validate(events: &[Event]) -> Result<Vec<Surface>, String> {
    let mut surfaces = Vec::with_capacity(events.len());
    // For each message of the current history, the index of the event that put it there.
    let mut messages: Vec<usize> = Vec::new();
    for (i, event) in events.iter().enumerate() {
        match place(event, i, messages.len(), Strictness::Validate)? {
            Placement::LogOnly => surfaces.push(Surface::LogOnly),
            Placement::Skip => surfaces.push(Surface::Current),
            Placement::Append => {
                surfaces.push(Surface::Current);
                messages.push(i);
            }
            Placement::Replace { start, end } => {
                surfaces.push(Surface::Current);
                for shadowed in messages.splice(start..end, [i]) {
                    surfaces[shadowed] = Surface::Shadowed;
                }
            }
        }
    }
    Ok(surfaces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(seq: u64, kind: &str, surface: Option<Value>, sources: Option<Vec<u64>>) -> Event {
        let data = match kind {
            "assistant/message" => {
                json!({"message": {"role": "assistant", "content": [{"type": "text", "text": format!("a{seq}")}]}})
            }
            _ => json!({"content": [{"type": "text", "text": format!("u{seq}")}]}),
        };
        Event { kind: kind.into(), seq, time: 0, data, source_event_seqs: sources, surface_op: surface }
    }

    fn append() -> Option<Value> {
        Some(json!("append"))
    }

    #[test]
    fn replacements_shadow_the_messages_they_cover() {
        let events = vec![
            event(0, "user/message", append(), None),
            event(1, "assistant/message", append(), Some(vec![0])),
            event(2, "compact/start", None, None),
            event(3, "user/message", Some(json!({"op": "replace", "start": 0, "end": 2})), None),
        ];
        let surfaces = validate(&events).unwrap();
        assert_eq!(surfaces, [Surface::Shadowed, Surface::Shadowed, Surface::LogOnly, Surface::Current]);
        // The live fold agrees: one message, the replacement.
        assert_eq!(derive_messages(&events), [events[3].data.clone()]);
    }

    #[test]
    fn surface_violations_are_named() {
        let missing = vec![event(0, "user/message", None, None)];
        assert!(validate(&missing).unwrap_err().contains("has no surfaceOp"));
        let too_far = vec![event(0, "user/message", Some(json!({"op": "replace", "start": 0, "end": 1})), None)];
        assert!(validate(&too_far).unwrap_err().contains("replaces messages 0..1"));
        let later = vec![event(0, "assistant/message", append(), Some(vec![0]))];
        assert!(validate(&later).unwrap_err().contains("not earlier"));
        let log_only = vec![event(0, "turn/start", append(), None)];
        assert!(validate(&log_only).unwrap_err().contains("log-only"));
        let gap = vec![event(1, "turn/start", None, None)];
        assert!(validate(&gap).unwrap_err().contains("seq 1 where 0"));
    }

    #[test]
    fn the_live_fold_clamps_and_appends_what_validation_refuses() {
        let events = vec![
            event(0, "user/message", None, None),
            event(1, "user/message", Some(json!("sideways")), None),
            event(2, "user/message", Some(json!({"op": "replace", "start": 1, "end": 9})), None),
        ];
        assert!(validate(&events).is_err());
        assert_eq!(derive_messages(&events), [events[0].data.clone(), events[2].data.clone()]);
    }

    #[test]
    fn an_assistant_message_without_content_takes_no_place() {
        let mut empty = event(0, "assistant/message", append(), None);
        empty.data["message"]["content"] = json!([]);
        assert_eq!(validate(std::slice::from_ref(&empty)).unwrap(), [Surface::Current]);
        assert!(derive_messages(&[empty]).is_empty());
    }
}
