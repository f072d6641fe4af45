//! Crash repair: closing a turn that a crash left open (dsh `repair.ts`). Pending tool calls get
//! synthetic results, an open step gets `step/end`, and the turn ends `interrupted`.

use super::event::{self, EventBody, Kind, TurnEndReason};
use super::record::Event;

/// Text of the synthetic result for a call whose `tool/call` was recorded but not its result.
pub(crate) const OUTCOME_UNKNOWN_TEXT: &str =
    "Error: kin stopped while this tool call was running; its outcome is unknown. Check its effects before retrying.";
/// Text of the synthetic result for a call the model requested but that never started.
pub(crate) const NOT_STARTED_TEXT: &str = "Error: kin stopped before this tool call started; it was not run.";
/// Text of the result of a call in a response the model's output limit cut off.
pub(crate) const CUT_OFF_TEXT: &str =
    "Error: the response was cut off at the model's output limit before this tool call was complete; it was not run.";

/// What a closing event says, before seqs and times are assigned.
#[derive(Debug, Clone, PartialEq)]
pub struct Closer {
    pub body: EventBody,
    pub source_event_seqs: Option<Vec<u64>>,
}

/// The events that close the last turn of `events` if it is still open; empty when balanced.
pub fn closers(events: &[Event]) -> Vec<Closer> {
    let Some(open) = events.iter().rposition(|e| e.kind == Kind::TurnStart) else {
        return Vec::new();
    };
    if events[open..].iter().any(|e| e.kind == Kind::TurnEnd) {
        return Vec::new();
    }
    let turn = events[open].get::<event::TurnStart>().map_or(0, |t| t.turn);
    let mut out = Vec::new();
    let mut step: Option<u64> = None;
    let mut requested: Vec<String> = Vec::new();
    let mut called: Vec<(String, u64)> = Vec::new();
    let mut answered: Vec<String> = Vec::new();
    for e in &events[open..] {
        match e.body() {
            EventBody::StepStart(start) => {
                step = Some(start.step);
                requested.clear();
                called.clear();
                answered.clear();
            }
            EventBody::StepEnd(_) => step = None,
            EventBody::AssistantMessage(m) => {
                requested.extend(m.message.tool_calls().into_iter().map(|c| c.id).filter(|id| !id.is_empty()));
            }
            EventBody::ToolCall(call) => called.push((call.call_id, e.seq)),
            EventBody::ToolResult(result) => answered.extend(result.call_id().map(str::to_string)),
            _ => {}
        }
    }
    if let Some(step) = step {
        for (id, seq) in &called {
            if !answered.contains(id) {
                let failure = failure("ToolOutcomeUnknownError", "TOOL_OUTCOME_UNKNOWN");
                let body = synthetic_result(turn, step, id, OUTCOME_UNKNOWN_TEXT, failure);
                out.push(Closer { body, source_event_seqs: Some(vec![*seq]) });
            }
        }
        for id in &requested {
            if !answered.contains(id) && !called.iter().any(|(c, _)| c == id) {
                out.push(Closer { body: not_run(turn, step, id, NOT_STARTED_TEXT), source_event_seqs: None });
            }
        }
        out.push(Closer { body: event::StepEnd { turn, step }.into(), source_event_seqs: None });
    }
    let end = event::TurnEnd { turn, reason: TurnEndReason::Interrupted };
    out.push(Closer { body: end.into(), source_event_seqs: None });
    out
}

/// The result of a call the model requested that was not run (`text` says why): every call of
/// a message gets a result, or the history cannot be sent to a model again.
pub(crate) fn not_run(turn: u64, step: u64, call_id: &str, text: &str) -> EventBody {
    synthetic_result(turn, step, call_id, text, failure("ToolNotStartedError", "TOOL_NOT_STARTED"))
}

fn failure(name: &str, code: &str) -> event::ToolFailure {
    event::ToolFailure { name: name.into(), code: code.into() }
}

fn synthetic_result(turn: u64, step: u64, call_id: &str, text: &str, failure: event::ToolFailure) -> EventBody {
    let content = vec![serde_json::json!({"type": "text", "text": text})];
    event::ToolResult::new(turn, step, call_id, content, Some(failure), None).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn ev(seq: u64, kind: &str, data: Value) -> Event {
        Event { kind: kind.into(), seq, time: 0, data: data.into(), source_event_seqs: None, surface_op: None }
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
        let kinds: Vec<_> = c.iter().map(|c| c.body.kind()).collect();
        assert_eq!(kinds, ["tool/result", "tool/result", "step/end", "turn/end"]);
        let code = |c: &Closer| match &c.body {
            EventBody::ToolResult(r) => r.error.as_ref().map(|e| e.code.clone()),
            _ => None,
        };
        assert_eq!(code(&c[0]).as_deref(), Some("TOOL_OUTCOME_UNKNOWN"));
        assert_eq!(c[0].source_event_seqs, Some(vec![3]));
        assert_eq!(code(&c[1]).as_deref(), Some("TOOL_NOT_STARTED"));
        assert_eq!(c[3].body, event::TurnEnd { turn: 2, reason: TurnEndReason::Interrupted }.into());
    }

    #[test]
    fn open_turn_between_steps_only_gets_turn_end() {
        let events = vec![
            ev(0, "turn/start", json!({"turn":1})),
            ev(1, "step/start", json!({"turn":1,"step":1})),
            ev(2, "step/end", json!({"turn":1,"step":1})),
        ];
        let kinds: Vec<_> = closers(&events).iter().map(|c| c.body.kind()).collect();
        assert_eq!(kinds, ["turn/end"]);
    }
}
