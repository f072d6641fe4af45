//! Conversions between ACP types and kin's session events and messages.

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, Diff, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus, SessionUpdate, StopReason,
    TextContent, ToolCall, ToolCallContent, ToolCallLocation, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
    ToolKind,
};
use serde_json::{Value, json};

use crate::agent::TurnEnd;
use crate::session::Event;

/// Prompt blocks → one dsh text block (text concatenated; a resource link becomes
/// `\n[resource_link name=<json> uri=<json>]\n`). Errors name what is unsupported.
pub fn prompt_content(blocks: &[ContentBlock]) -> Result<Vec<Value>, String> {
    let mut text = String::new();
    for block in blocks {
        match block {
            ContentBlock::Text(t) => text.push_str(&t.text),
            ContentBlock::ResourceLink(link) => {
                let name = serde_json::to_string(&link.name).unwrap_or_default();
                let uri = serde_json::to_string(&link.uri).unwrap_or_default();
                text.push_str(&format!("\n[resource_link name={name} uri={uri}]\n"));
            }
            _ => return Err("only text and resource_link prompt content is supported".into()),
        }
    }
    if text.trim().is_empty() {
        return Err("empty prompt".into());
    }
    Ok(vec![json!({"type": "text", "text": text})])
}

fn text_chunk(text: &str) -> ContentChunk {
    ContentChunk::new(ContentBlock::Text(TextContent::new(text)))
}

/// The live update an appended event produces, if any: streamed text and reasoning deltas.
pub fn live_update(event: &Event) -> Option<SessionUpdate> {
    if event.kind == "tool/call" || event.kind == "tool/result" {
        return tool_update(event);
    }
    if event.kind == "llm/retry" {
        let d = &event.data;
        let delay = d["delayMs"].as_u64().unwrap_or(0) as f64 / 1000.0;
        let text = format!(
            "Model request failed ({}); retrying in {delay:.1} s (attempt {} of {}).\n",
            d["reason"].as_str().unwrap_or("unknown error"),
            d["attempt"],
            d["maxAttempts"]
        );
        return Some(SessionUpdate::AgentThoughtChunk(text_chunk(&text)));
    }
    if event.kind == "todo/write" {
        return Some(plan_update(event));
    }
    if event.kind == "tool/progress" {
        return progress_update(event);
    }
    if event.kind != "assistant/chunk" {
        return None;
    }
    let chunk = &event.data["chunk"];
    let text = chunk["text"].as_str().filter(|t| !t.is_empty())?;
    match chunk["type"].as_str() {
        Some("text-delta") => Some(SessionUpdate::AgentMessageChunk(text_chunk(text))),
        Some("reasoning-delta") => Some(SessionUpdate::AgentThoughtChunk(text_chunk(text))),
        _ => None,
    }
}

/// The updates that replay a stored event to a client loading the session: user prompts,
/// committed assistant text and reasoning.
pub fn replay_updates(event: &Event) -> Vec<SessionUpdate> {
    match event.kind.as_str() {
        "user/message" if event.data["source"]["kind"] == "user" => blocks(&event.data["content"])
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .map(|t| SessionUpdate::UserMessageChunk(text_chunk(t)))
            .collect(),
        "assistant/message" => blocks(&event.data["message"]["content"])
            .filter_map(|b| {
                let text = b["text"].as_str().filter(|t| !t.is_empty())?;
                match b["type"].as_str() {
                    Some("text") => Some(SessionUpdate::AgentMessageChunk(text_chunk(text))),
                    Some("reasoning") => Some(SessionUpdate::AgentThoughtChunk(text_chunk(text))),
                    _ => None,
                }
            })
            .collect(),
        "tool/call" | "tool/result" => tool_update(event).into_iter().collect(),
        "todo/write" => vec![plan_update(event)],
        _ => Vec::new(),
    }
}

/// `tool/call` → a `tool_call` (in progress, with title, kind, locations and raw input);
/// `tool/result` → a `tool_call_update` (completed or failed, with the result text, or the diff
/// a successful write or edit recorded in `data.meta.diff`).
fn tool_update(event: &Event) -> Option<SessionUpdate> {
    let data = &event.data;
    if event.kind == "tool/call" {
        let id = data["callId"].as_str()?;
        let name = data["name"].as_str().unwrap_or("tool");
        let raw = data["arguments"].as_str().unwrap_or("");
        let args: Value = serde_json::from_str(raw).unwrap_or_else(|_| json!(raw));
        let mut call = ToolCall::new(id.to_string(), crate::tools::call_title(name, &args))
            .kind(tool_kind(name))
            .status(ToolCallStatus::InProgress)
            .raw_input(args.clone());
        if let Some(path) = args["file_path"].as_str().or(args["path"].as_str()) {
            let mut location = ToolCallLocation::new(path);
            if let Some(line) = args["offset"].as_u64() {
                location = location.line(u32::try_from(line).ok());
            }
            call = call.locations(vec![location]);
        }
        return Some(SessionUpdate::ToolCall(call));
    }
    let block = &data["message"]["content"][0];
    let id = block["toolCallId"].as_str()?;
    let text: String = blocks(&block["content"]).filter_map(|b| b["text"].as_str()).collect();
    let status = if block["isError"] == true { ToolCallStatus::Failed } else { ToolCallStatus::Completed };
    let content = match diff_content(&data["meta"]["diff"]) {
        Some(diff) if status == ToolCallStatus::Completed => diff,
        _ => ToolCallContent::from(ContentBlock::Text(TextContent::new(text))),
    };
    let fields = ToolCallUpdateFields::new().status(status).content(vec![content]);
    Some(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.to_string(), fields)))
}

/// `tool/progress` → the running call's content: what it is doing now (live only; a loaded
/// session shows the call's result instead).
fn progress_update(event: &Event) -> Option<SessionUpdate> {
    let id = event.data["callId"].as_str()?;
    let text = event.data["text"].as_str()?;
    let content = ToolCallContent::from(ContentBlock::Text(TextContent::new(text)));
    let fields = ToolCallUpdateFields::new().content(vec![content]);
    Some(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.to_string(), fields)))
}

/// `{path, oldText, newText}` → diff content (`oldText` null: a new file).
fn diff_content(diff: &Value) -> Option<ToolCallContent> {
    let path = diff["path"].as_str()?;
    let new_text = diff["newText"].as_str()?;
    let old_text = diff["oldText"].as_str().map(str::to_string);
    Some(ToolCallContent::Diff(Diff::new(path, new_text).old_text(old_text)))
}

/// `todo/write` → the editor's plan.
fn plan_update(event: &Event) -> SessionUpdate {
    let entries = blocks(&event.data["todos"])
        .map(|t| {
            let status = match t["status"].as_str() {
                Some("completed") => PlanEntryStatus::Completed,
                Some("in_progress") => PlanEntryStatus::InProgress,
                _ => PlanEntryStatus::Pending,
            };
            PlanEntry::new(t["content"].as_str().unwrap_or_default(), PlanEntryPriority::Medium, status)
        })
        .collect();
    SessionUpdate::Plan(Plan::new(entries))
}

/// The kind of one of kin's tools, or of an ACP kind already (a question an external child
/// forwards names its call's kind).
pub(super) fn tool_kind(name: &str) -> ToolKind {
    match name {
        "read" => ToolKind::Read,
        "write" | "edit" => ToolKind::Edit,
        "bash" | "execute" => ToolKind::Execute,
        "glob" | "grep" | "search" => ToolKind::Search,
        "todo_write" | "think" => ToolKind::Think,
        "delete" => ToolKind::Delete,
        "move" => ToolKind::Move,
        "fetch" => ToolKind::Fetch,
        _ => ToolKind::Other,
    }
}

fn blocks(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

/// A turn's end as an ACP stop reason; `Err` carries the failure message of an error turn.
pub fn stop_reason(end: &TurnEnd) -> Result<StopReason, String> {
    match end {
        TurnEnd::Completed => Ok(StopReason::EndTurn),
        TurnEnd::MaxTokens => Ok(StopReason::MaxTokens),
        TurnEnd::Aborted | TurnEnd::Disposed => Ok(StopReason::Cancelled),
        TurnEnd::Error(message) => Err(message.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, data: Value) -> Event {
        Event { kind: kind.into(), seq: 0, time: 0, data, source_event_seqs: None, surface_op: None }
    }

    fn result(is_error: bool, meta: Option<Value>) -> Event {
        let mut data = json!({
            "turn": 1,
            "step": 1,
            "message": {
                "source": {"kind": "tool", "callId": "c1"},
                "content": [{"type": "tool-result", "toolCallId": "c1", "content": [{"type": "text", "text": "Edited /w/a.txt"}], "isError": is_error}],
                "role": "user",
                "id": "m1",
            },
        });
        if let Some(meta) = meta {
            data["meta"] = meta;
        }
        event("tool/result", data)
    }

    #[test]
    fn progress_is_the_running_calls_content() {
        let progress =
            event("tool/progress", json!({"turn": 1, "step": 1, "callId": "c1", "text": "acp:x: Run tests"}));
        let update = serde_json::to_value(live_update(&progress).unwrap()).unwrap();
        assert_eq!(update["sessionUpdate"], "tool_call_update");
        assert_eq!(update["toolCallId"], "c1");
        assert!(update.get("status").is_none(), "{update}");
        assert_eq!(
            update["content"],
            json!([{"type": "content", "content": {"type": "text", "text": "acp:x: Run tests"}}])
        );
        assert!(replay_updates(&progress).is_empty(), "not replayed on load");
    }

    #[test]
    fn a_write_result_with_a_diff_shows_the_diff() {
        let meta = json!({"diff": {"path": "/w/a.txt", "oldText": "a\n", "newText": "b\n"}});
        let update = live_update(&result(false, Some(meta))).unwrap();
        let wire = serde_json::to_value(&update).unwrap();
        assert_eq!(wire["sessionUpdate"], "tool_call_update");
        assert_eq!(wire["status"], "completed");
        assert_eq!(wire["content"], json!([{"type": "diff", "path": "/w/a.txt", "oldText": "a\n", "newText": "b\n"}]));
        let created = json!({"diff": {"path": "/w/n.txt", "oldText": null, "newText": "n\n"}});
        let wire = serde_json::to_value(live_update(&result(false, Some(created))).unwrap()).unwrap();
        assert_eq!(wire["content"][0]["type"], "diff");
        assert!(wire["content"][0].get("oldText").is_none_or(Value::is_null));
    }

    #[test]
    fn other_results_show_their_text() {
        let wire = serde_json::to_value(live_update(&result(false, None)).unwrap()).unwrap();
        assert_eq!(
            wire["content"],
            json!([{"type": "content", "content": {"type": "text", "text": "Edited /w/a.txt"}}])
        );
        let meta = json!({"diff": {"path": "/w/a.txt", "oldText": "a\n", "newText": "b\n"}});
        let wire = serde_json::to_value(live_update(&result(true, Some(meta))).unwrap()).unwrap();
        assert_eq!(wire["status"], "failed");
        assert_eq!(wire["content"][0]["type"], "content");
    }

    #[test]
    fn todo_write_is_a_plan() {
        let todos = json!({"todos": [
            {"content": "Read", "status": "completed"},
            {"content": "Fix", "status": "in_progress"},
            {"content": "Test", "status": "pending"}
        ]});
        let wire = serde_json::to_value(live_update(&event("todo/write", todos)).unwrap()).unwrap();
        assert_eq!(wire["sessionUpdate"], "plan");
        let statuses: Vec<&str> =
            wire["entries"].as_array().unwrap().iter().map(|e| e["status"].as_str().unwrap()).collect();
        assert_eq!(statuses, ["completed", "in_progress", "pending"]);
    }
}
