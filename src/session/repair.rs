//! Crash repair: closing a turn that a crash left open (dsh `repair.ts`). Pending tool calls get
//! synthetic results, an open step gets `step/end`, and the turn ends `interrupted`.

use serde_json::{Value, json};

use super::event::Kind;
use super::record::Event;

/// Text of the synthetic result for a call whose `tool/call` was recorded but not its result.
pub const OUTCOME_UNKNOWN_TEXT: &str =
    "Error: kin stopped while this tool call was running; its outcome is unknown. Check its effects before retrying.";
/// Text of the synthetic result for a call the model requested but that never started.
pub const NOT_STARTED_TEXT: &str = "Error: kin stopped before this tool call started; it was not run.";

/// What a closing event says, before seqs and times are assigned.
#[derive(Debug, Clone, PartialEq)]
pub struct Closer {
    pub kind: &'static str,
    pub data: Value,
    pub source_event_seqs: Option<Vec<u64>>,
    pub surface: bool,
}

/// The events that close the last turn of `events` if it is still open; empty when balanced.
pub fn closers(events: &[Event]) -> Vec<Closer> {
    let Some(open) = events.iter().rposition(|e| e.kind == Kind::TurnStart) else {
        return Vec::new();
    };
    if events[open..].iter().any(|e| e.kind == Kind::TurnEnd) {
        return Vec::new();
    }
    let turn = events[open].data.get("turn").cloned().unwrap_or(json!(0));
    let mut out = Vec::new();
    let mut step: Option<Value> = None;
    let mut requested: Vec<String> = Vec::new();
    let mut called: Vec<(String, u64)> = Vec::new();
    let mut answered: Vec<String> = Vec::new();
    for e in &events[open..] {
        match e.kind {
            Kind::StepStart => {
                step = e.data.get("step").cloned();
                requested.clear();
                called.clear();
                answered.clear();
            }
            Kind::StepEnd => step = None,
            Kind::AssistantMessage => requested.extend(tool_call_ids(&e.data["message"])),
            Kind::ToolCall => {
                if let Some(id) = e.data.get("callId").and_then(Value::as_str) {
                    called.push((id.to_string(), e.seq));
                }
            }
            Kind::ToolResult => {
                if let Some(id) = e.data["message"]["content"][0]["toolCallId"].as_str() {
                    answered.push(id.to_string());
                }
            }
            _ => {}
        }
    }
    if let Some(step_value) = &step {
        for (id, seq) in &called {
            if !answered.contains(id) {
                let data = synthetic_result(
                    &turn,
                    step_value,
                    id,
                    OUTCOME_UNKNOWN_TEXT,
                    "ToolOutcomeUnknownError",
                    "TOOL_OUTCOME_UNKNOWN",
                );
                out.push(Closer { kind: "tool/result", data, source_event_seqs: Some(vec![*seq]), surface: true });
            }
        }
        for id in &requested {
            if !answered.contains(id) && !called.iter().any(|(c, _)| c == id) {
                let data = synthetic_result(
                    &turn,
                    step_value,
                    id,
                    NOT_STARTED_TEXT,
                    "ToolNotStartedError",
                    "TOOL_NOT_STARTED",
                );
                out.push(Closer { kind: "tool/result", data, source_event_seqs: None, surface: true });
            }
        }
        out.push(Closer {
            kind: "step/end",
            data: json!({"turn": turn, "step": step_value}),
            source_event_seqs: None,
            surface: false,
        });
    }
    out.push(Closer {
        kind: "turn/end",
        data: json!({"turn": turn, "reason": {"kind": "interrupted"}}),
        source_event_seqs: None,
        surface: false,
    });
    out
}

/// Ids of the `tool-call` blocks of an assistant message.
pub fn tool_call_ids(message: &Value) -> Vec<String> {
    message["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| b["type"] == "tool-call")
                .filter_map(|b| b["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn synthetic_result(turn: &Value, step: &Value, call_id: &str, text: &str, name: &str, code: &str) -> Value {
    json!({
        "turn": turn,
        "step": step,
        "message": {
            "source": {"kind": "tool", "callId": call_id},
            "content": [{"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}], "isError": true}],
            "role": "user",
            "id": uuid::Uuid::new_v4().to_string(),
        },
        "error": {"name": name, "code": code},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64, kind: &str, data: Value) -> Event {
        Event { kind: kind.into(), seq, time: 0, data, source_event_seqs: None, surface_op: None }
    }

    #[test]
    fn balanced_log_needs_no_closers() {
        let events = vec![ev(0, "turn/start", json!({"turn":1})), ev(1, "turn/end", json!({"turn":1}))];
        assert!(closers(&events).is_empty());
    }

    #[test]
    fn open_step_with_pending_calls_is_closed_in_order() {
        let message = json!({"content":[{"type":"tool-call","id":"a","name":"x","arguments":"{}"},{"type":"tool-call","id":"b","name":"x","arguments":"{}"}]});
        let events = vec![
            ev(0, "turn/start", json!({"turn":2})),
            ev(1, "step/start", json!({"turn":2,"step":1})),
            ev(2, "assistant/message", json!({"turn":2,"step":1,"message":message})),
            ev(3, "tool/call", json!({"turn":2,"step":1,"callId":"a","name":"x","arguments":"{}"})),
        ];
        let c = closers(&events);
        let kinds: Vec<_> = c.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, ["tool/result", "tool/result", "step/end", "turn/end"]);
        assert_eq!(c[0].data["error"]["code"], "TOOL_OUTCOME_UNKNOWN");
        assert_eq!(c[0].source_event_seqs, Some(vec![3]));
        assert_eq!(c[1].data["error"]["code"], "TOOL_NOT_STARTED");
        assert_eq!(c[3].data["reason"]["kind"], "interrupted");
        assert_eq!(c[3].data["turn"], 2);
    }

    #[test]
    fn open_turn_between_steps_only_gets_turn_end() {
        let events = vec![
            ev(0, "turn/start", json!({"turn":1})),
            ev(1, "step/start", json!({"turn":1,"step":1})),
            ev(2, "step/end", json!({"turn":1,"step":1})),
        ];
        let kinds: Vec<_> = closers(&events).iter().map(|c| c.kind).collect();
        assert_eq!(kinds, ["turn/end"]);
    }
}
