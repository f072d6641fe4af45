//! Canned model responses built from `StreamChunk`s (the chunk union itself is part of the log
//! format and lives in `session::chunk`).

use super::{FinishReason, StreamChunk};

/// A complete text response: block-start, one delta per piece, block-end, usage, finish.
pub fn text_response(pieces: &[&str]) -> Vec<StreamChunk> {
    let text: String = pieces.concat();
    let mut chunks = vec![StreamChunk::BlockStart { index: 0, block_type: "text".into() }];
    chunks.extend(pieces.iter().map(|p| StreamChunk::TextDelta { index: 0, text: (*p).to_string() }));
    chunks.push(StreamChunk::BlockEnd { index: 0, block: serde_json::json!({"type": "text", "text": text}) });
    chunks.push(StreamChunk::Usage { usage: serde_json::json!({"inputTokens": 10, "outputTokens": text.len()}) });
    chunks.push(StreamChunk::Finish { reason: FinishReason::Stop, replay_state: None });
    chunks
}

/// A response asking for one tool call.
pub fn tool_call_response(id: &str, name: &str, arguments: &str) -> Vec<StreamChunk> {
    vec![
        StreamChunk::BlockStart { index: 0, block_type: "tool-call".into() },
        StreamChunk::ToolCallDelta {
            index: 0,
            id: id.into(),
            name: Some(name.into()),
            arguments_delta: arguments.into(),
        },
        StreamChunk::BlockEnd {
            index: 0,
            block: serde_json::json!({"type": "tool-call", "id": id, "name": name, "arguments": arguments}),
        },
        StreamChunk::Usage { usage: serde_json::json!({"inputTokens": 10, "outputTokens": 5}) },
        StreamChunk::Finish { reason: FinishReason::ToolCalls, replay_state: None },
    ]
}
