//! The Anthropic Messages client (`POST {base}/v1/messages`, streaming). dsh messages become
//! Anthropic's alternating user/assistant turns (consecutive same-role messages merged, tool
//! results as `tool_result` blocks, tool calls as `tool_use` blocks with parsed input, thinking
//! blocks sent back with their signature), and the SSE events become dsh chunks: text, thinking
//! (a reasoning block carrying `signature`), tool calls from `input_json_delta`, usage and the
//! stop reason.

use std::collections::BTreeMap;

use super::sse::Event;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::http::{self, Api, AttemptError, Decoder, HttpModel, Server};
use super::utf16::{self, Joiner};
use super::{Failure, FinishReason, ModelRequest, StreamChunk};
use crate::tools::image;

/// The `anthropic-version` header kin speaks.
pub(crate) const ANTHROPIC_VERSION: &str = "2023-06-01";
/// `max_tokens` when none is configured (the API requires one).
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 8192;

/// How to reach one Anthropic Messages endpoint.
#[derive(Debug, Clone)]
pub(crate) struct AnthropicConfig {
    /// The client posts to `{base_url}/v1/messages`, with `x-api-key: <key>`.
    pub server: Server,
    pub max_tokens: u32,
    /// Enables extended thinking: `low`, `medium`, `high`, `max`, or a token budget; `off` or
    /// None leaves it disabled. The budget is kept below `max_tokens`.
    pub reasoning_effort: Option<String>,
    /// The model takes images (a prompt's and a tool result's, as image blocks); otherwise each
    /// is a placeholder text.
    pub images: bool,
}

/// A model behind the Anthropic Messages API.
pub(crate) type AnthropicModel = HttpModel<AnthropicConfig>;

impl Api for AnthropicConfig {
    type Decoder = MessagesDecoder;
    const PATH: &'static str = "/v1/messages";
    const MODELS_PATH: &'static str = "/v1/models";

    fn server(&self) -> &Server {
        &self.server
    }

    fn auth(key: &str) -> Result<(HeaderName, HeaderValue), Failure> {
        Ok((HeaderName::from_static("x-api-key"), http::secret_value(key)?))
    }

    fn fixed_headers() -> Vec<(HeaderName, HeaderValue)> {
        vec![(HeaderName::from_static("anthropic-version"), HeaderValue::from_static(ANTHROPIC_VERSION))]
    }

    /// The JSON body of the request for one call.
    fn request_body(&self, request: &ModelRequest) -> Value {
        let max_tokens = request.max_tokens.unwrap_or(self.max_tokens);
        let mut body = json!({
            "model": request.route.model,
            "max_tokens": max_tokens,
            "messages": anthropic_messages(&request.messages, self.images),
            "stream": true,
        });
        if !request.system.is_empty() {
            body["system"] = request.system.clone().into();
        }
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| {
                    json!({
                        "name": tool.name,
                        "description": tool.description,
                        "input_schema": tool.parameters,
                    })
                })
                .collect();
        }
        if let Some(budget) = thinking_budget(self.reasoning_effort.as_deref(), max_tokens) {
            body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
        }
        body
    }
}

/// The thinking budget for a reasoning effort, kept at least 1024 below `max_tokens`
/// (None when thinking stays off or the budget would fall under the API's minimum of 1024).
fn thinking_budget(effort: Option<&str>, max_tokens: u32) -> Option<u32> {
    let wanted = match effort? {
        "minimal" | "low" => 1024,
        "medium" => 4096,
        "high" => 16_384,
        "max" | "xhigh" => 32_768,
        other => other.trim().parse::<u32>().ok()?,
    };
    let budget = wanted.min(max_tokens.saturating_sub(1024));
    (budget >= 1024).then_some(budget)
}

/// A dsh image block as an Anthropic image block, or its placeholder text for a model that
/// takes no images.
fn image_block(block: &Value, images: bool) -> Value {
    if images {
        json!({"type": "image", "source": {"type": "base64", "media_type": block["mediaType"], "data": block["data"]}})
    } else {
        json!({"type": "text", "text": image::placeholder(block["mediaType"].as_str().unwrap_or("image"))})
    }
}

/// A tool result's blocks as Anthropic takes them: its text, and its images (`read`'s, an MCP
/// tool's).
fn result_blocks(blocks: &[Value], images: bool) -> Vec<Value> {
    blocks
        .iter()
        .filter_map(|b| match b["type"].as_str() {
            Some("text") => b["text"].as_str().filter(|t| !t.is_empty()).map(|t| json!({"type": "text", "text": t})),
            Some("image") => Some(image_block(b, images)),
            _ => None,
        })
        .collect()
}

/// One dsh content block as an Anthropic block, if Anthropic can take it in that role.
fn anthropic_block(block: &Value, assistant: bool, images: bool) -> Option<Value> {
    let text = |key: &str| block[key].as_str().unwrap_or_default().to_string();
    match block["type"].as_str()? {
        "text" if !text("text").is_empty() => Some(json!({"type": "text", "text": text("text")})),
        "image" if !assistant => Some(image_block(block, images)),
        "tool-result" if !assistant => {
            let content = result_blocks(block["content"].as_array().map(Vec::as_slice).unwrap_or_default(), images);
            let mut result = json!({
                "type": "tool_result",
                "tool_use_id": block["toolCallId"],
                "is_error": block["isError"].as_bool().unwrap_or(false),
            });
            if !content.is_empty() {
                result["content"] = content.into();
            }
            Some(result)
        }
        "tool-call" if assistant => {
            let input = match &block["arguments"] {
                Value::String(raw) => serde_json::from_str::<Value>(raw).ok(),
                Value::Object(_) => Some(block["arguments"].clone()),
                _ => None,
            }
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
            Some(json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": input}))
        }
        // Only signed thinking can go back; reasoning from other providers has no signature.
        "reasoning" if assistant && !text("signature").is_empty() => Some(json!({
            "type": "thinking",
            "thinking": text("text"),
            "signature": text("signature"),
        })),
        "reasoning" if assistant && !text("redactedData").is_empty() => {
            Some(json!({"type": "redacted_thinking", "data": text("redactedData")}))
        }
        _ => None,
    }
}

/// dsh messages as Anthropic's alternating user/assistant messages.
fn anthropic_messages(messages: &[Value], images: bool) -> Vec<Value> {
    let mut merged: Vec<(bool, Vec<Value>)> = Vec::new();
    for message in messages {
        let assistant = match message["role"].as_str() {
            Some("assistant") => true,
            Some("user") => false,
            _ => continue,
        };
        let blocks: Vec<Value> = message["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| anthropic_block(b, assistant, images))
            .collect();
        if blocks.is_empty() {
            continue;
        }
        let same_role = merged.last().is_some_and(|(last, _)| *last == assistant);
        match merged.last_mut() {
            Some((_, last)) if same_role => last.extend(blocks),
            _ => merged.push((assistant, blocks)),
        }
    }
    merged
        .into_iter()
        .map(|(assistant, mut blocks)| {
            if !assistant {
                // Tool results must lead a user message.
                blocks.sort_by_key(|b| b["type"] != "tool_result");
            }
            let role = if assistant { "assistant" } else { "user" };
            json!({"role": role, "content": blocks})
        })
        .collect()
}

/// A content block being streamed.
enum OpenBlock {
    Text(String),
    Thinking {
        text: String,
        signature: String,
    },
    Redacted(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    /// A block kind kin does not surface (server tools and the like).
    Ignored,
}

impl OpenBlock {
    /// The finished dsh block.
    fn finish(self) -> Option<Value> {
        match self {
            OpenBlock::Text(text) => Some(json!({"type": "text", "text": text})),
            OpenBlock::Thinking { text, signature } => {
                let mut block = json!({"type": "reasoning", "text": text});
                if !signature.is_empty() {
                    block["signature"] = signature.into();
                }
                Some(block)
            }
            OpenBlock::Redacted(data) => Some(json!({"type": "reasoning", "text": "", "redactedData": data})),
            OpenBlock::ToolUse { id, name, json } => {
                let arguments = if json.trim().is_empty() { "{}".to_string() } else { json };
                Some(json!({"type": "tool-call", "id": id, "name": name, "arguments": arguments}))
            }
            OpenBlock::Ignored => None,
        }
    }
}

/// Messages SSE → dsh chunks.
#[derive(Default)]
pub(crate) struct MessagesDecoder {
    open: BTreeMap<u64, OpenBlock>,
    tool_calls: bool,
    stop_reason: Option<String>,
    usage_seen: bool,
    input_tokens: u64,
    output_tokens: u64,
    cache_read: Option<u64>,
    cache_write: Option<u64>,
    /// Surrogate halves held across events, per block index.
    joins: BTreeMap<u64, Joiner>,
    /// The event being decoded used surrogate stand-ins (see `utf16::parse_event`).
    marked: bool,
}

impl MessagesDecoder {
    /// A streamed piece of block `index`, its surrogate halves joined across events.
    fn joined(&mut self, index: u64, piece: &str) -> String {
        self.joins.entry(index).or_default().piece(piece, self.marked).into_owned()
    }

    /// Ends block `index`'s pieces: a high surrogate half never completed becomes U+FFFD, added
    /// to the block and streamed.
    fn end_pieces(&mut self, index: u64, out: &mut Vec<StreamChunk>) {
        let Some(tail) = self.joins.remove(&index).and_then(|mut joiner| joiner.finish()) else {
            return;
        };
        let tail = tail.to_string();
        match self.open.get_mut(&index) {
            Some(OpenBlock::Text(text)) => {
                text.push_str(&tail);
                out.push(StreamChunk::TextDelta { index, text: tail });
            }
            Some(OpenBlock::Thinking { text, .. }) => {
                text.push_str(&tail);
                out.push(StreamChunk::ReasoningDelta { index, text: tail });
            }
            Some(OpenBlock::ToolUse { id, json, .. }) => {
                json.push_str(&tail);
                out.push(StreamChunk::ToolCallDelta { index, id: id.clone(), name: None, arguments_delta: tail });
            }
            Some(OpenBlock::Redacted(_) | OpenBlock::Ignored) | None => {}
        }
    }

    /// Usage fields are running totals: the latest value of each wins.
    fn usage(&mut self, usage: &Value) {
        if !usage.is_object() {
            return;
        }
        self.usage_seen = true;
        if let Some(n) = usage["input_tokens"].as_u64() {
            self.input_tokens = n;
        }
        if let Some(n) = usage["output_tokens"].as_u64() {
            self.output_tokens = n;
        }
        if let Some(n) = usage["cache_read_input_tokens"].as_u64() {
            self.cache_read = Some(n);
        }
        if let Some(n) = usage["cache_creation_input_tokens"].as_u64() {
            self.cache_write = Some(n);
        }
    }

    fn block_start(&mut self, index: u64, block: &Value, out: &mut Vec<StreamChunk>) {
        let marked = self.marked;
        let text = |key: &str| Joiner::whole(block[key].as_str().unwrap_or_default(), marked).into_owned();
        let kind = match block["type"].as_str() {
            Some("text") => "text",
            Some("thinking" | "redacted_thinking") => "reasoning",
            Some("tool_use") => "tool-call",
            _ => {
                self.open.insert(index, OpenBlock::Ignored);
                return;
            }
        };
        out.push(StreamChunk::BlockStart { index, block_type: kind.into() });
        let open = match block["type"].as_str() {
            Some("text") => {
                let initial = text("text");
                if !initial.is_empty() {
                    out.push(StreamChunk::TextDelta { index, text: initial.clone() });
                }
                OpenBlock::Text(initial)
            }
            Some("thinking") => {
                let initial = text("thinking");
                if !initial.is_empty() {
                    out.push(StreamChunk::ReasoningDelta { index, text: initial.clone() });
                }
                OpenBlock::Thinking { text: initial, signature: text("signature") }
            }
            Some("redacted_thinking") => OpenBlock::Redacted(text("data")),
            _ => {
                let (id, name) = (text("id"), text("name"));
                // The input arrives as `input_json_delta`s; a non-empty initial input is whole.
                let json = match &block["input"] {
                    Value::Object(fields) if !fields.is_empty() => block["input"].to_string(),
                    _ => String::new(),
                };
                out.push(StreamChunk::ToolCallDelta {
                    index,
                    id: id.clone(),
                    name: Some(name.clone()),
                    arguments_delta: json.clone(),
                });
                self.tool_calls = true;
                OpenBlock::ToolUse { id, name, json }
            }
        };
        self.open.insert(index, open);
    }

    fn block_delta(&mut self, index: u64, delta: &Value, out: &mut Vec<StreamChunk>) {
        let raw = |key: &str| delta[key].as_str().unwrap_or_default();
        let kind = delta["type"].as_str();
        let key = match kind {
            Some("text_delta") => "text",
            Some("thinking_delta") => "thinking",
            Some("signature_delta") => "signature",
            Some("input_json_delta") => "partial_json",
            _ => return,
        };
        let piece = if key == "signature" { raw(key).to_string() } else { self.joined(index, raw(key)) };
        match (self.open.get_mut(&index), kind) {
            (Some(OpenBlock::Text(text)), Some("text_delta")) => {
                text.push_str(&piece);
                if !piece.is_empty() {
                    out.push(StreamChunk::TextDelta { index, text: piece });
                }
            }
            (Some(OpenBlock::Thinking { text, .. }), Some("thinking_delta")) => {
                text.push_str(&piece);
                if !piece.is_empty() {
                    out.push(StreamChunk::ReasoningDelta { index, text: piece });
                }
            }
            (Some(OpenBlock::Thinking { signature, .. }), Some("signature_delta")) => {
                signature.push_str(&piece);
            }
            (Some(OpenBlock::ToolUse { id, json, .. }), Some("input_json_delta")) => {
                json.push_str(&piece);
                if !piece.is_empty() {
                    out.push(StreamChunk::ToolCallDelta { index, id: id.clone(), name: None, arguments_delta: piece });
                }
            }
            _ => {}
        }
    }

    fn block_stop(&mut self, index: u64, out: &mut Vec<StreamChunk>) {
        self.end_pieces(index, out);
        if let Some(block) = self.open.remove(&index).and_then(OpenBlock::finish) {
            out.push(StreamChunk::BlockEnd { index, block });
        }
    }

    /// Closes what is still open and appends usage and the finish.
    fn finish(&mut self, out: &mut Vec<StreamChunk>) -> Result<(), AttemptError> {
        let reason = self.stop_reason.take().unwrap_or_default();
        let held: Vec<u64> = self.joins.keys().copied().collect();
        for index in held {
            self.end_pieces(index, out);
        }
        for (index, open) in std::mem::take(&mut self.open) {
            if let Some(block) = open.finish() {
                out.push(StreamChunk::BlockEnd { index, block });
            }
        }
        if self.usage_seen {
            let cache_read = self.cache_read.unwrap_or(0);
            let cache_write = self.cache_write.unwrap_or(0);
            let mut usage = json!({
                "inputTokens": self.input_tokens + cache_read + cache_write,
                "outputTokens": self.output_tokens,
            });
            if let Some(n) = self.cache_read {
                usage["cacheReadTokens"] = n.into();
            }
            if let Some(n) = self.cache_write {
                usage["cacheWriteTokens"] = n.into();
            }
            out.push(StreamChunk::Usage { usage });
        }
        let reason = match reason.as_str() {
            "tool_use" => FinishReason::ToolCalls,
            "max_tokens" | "model_context_window_exceeded" => FinishReason::MaxTokens,
            _ if self.tool_calls => FinishReason::ToolCalls,
            _ => FinishReason::Stop,
        };
        out.push(StreamChunk::Finish { reason, replay_state: None });
        Ok(())
    }
}

impl Decoder for MessagesDecoder {
    fn event(&mut self, event: &Event, out: &mut Vec<StreamChunk>) -> Result<bool, AttemptError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        let (value, marked) = utf16::parse_event(data).map_err(|e| http::unreadable(data, &e))?;
        self.marked = marked;
        let kind = value["type"].as_str().unwrap_or(event.event.as_str());
        let index = value["index"].as_u64().unwrap_or(0);
        match kind {
            "message_start" => self.usage(&value["message"]["usage"]),
            "content_block_start" => self.block_start(index, &value["content_block"], out),
            "content_block_delta" => self.block_delta(index, &value["delta"], out),
            "content_block_stop" => self.block_stop(index, out),
            "message_delta" => {
                if let Some(reason) = value["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(reason.to_string());
                }
                self.usage(&value["usage"]);
            }
            "message_stop" => {
                self.finish(out)?;
                return Ok(true);
            }
            "error" => return Err(http::stream_error(&value["error"])),
            // `ping` and event kinds added later.
            _ => {}
        }
        Ok(false)
    }

    fn end(&mut self, out: &mut Vec<StreamChunk>) -> Result<(), AttemptError> {
        // The stop reason arrived, only `message_stop` is missing: that is complete.
        if self.stop_reason.is_none() {
            return Err(http::incomplete());
        }
        self.finish(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_alternate_and_keep_signed_thinking() {
        let messages = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}),
            json!({"role": "user", "content": [{"type": "text", "text": "more"}], "source": {"kind": "user"}}),
            json!({"role": "assistant", "content": [
                {"type": "reasoning", "text": "plan", "signature": "sig"},
                {"type": "reasoning", "text": "unsigned"},
                {"type": "tool-call", "id": "t1", "name": "read", "arguments": "{\"path\":\"a\"}"},
                {"type": "tool-call", "id": "t2", "name": "read", "arguments": "not json"},
            ]}),
            json!({"role": "user", "source": {"kind": "tool", "callId": "t1"}, "content": [{"type": "tool-result", "toolCallId": "t1", "content": [{"type": "text", "text": "A"}], "isError": false}]}),
            json!({"role": "user", "source": {"kind": "tool", "callId": "t2"}, "content": [{"type": "tool-result", "toolCallId": "t2", "content": [], "isError": true}]}),
        ];
        assert_eq!(
            anthropic_messages(&messages, true),
            vec![
                json!({"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "more"}]}),
                json!({"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "plan", "signature": "sig"},
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}},
                    {"type": "tool_use", "id": "t2", "name": "read", "input": {}},
                ]}),
                json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "is_error": false, "content": [{"type": "text", "text": "A"}]},
                    {"type": "tool_result", "tool_use_id": "t2", "is_error": true},
                ]}),
            ]
        );
    }

    #[test]
    fn images_are_image_blocks_or_placeholders() {
        let image = json!({"type": "image", "mediaType": "image/jpeg", "data": "/9j/4A=="});
        let messages = vec![
            json!({"role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": "see"}, image.clone()]}),
            json!({"role": "assistant", "content": [{"type": "tool-call", "id": "t1", "name": "read", "arguments": "{}"}]}),
            json!({"role": "user", "source": {"kind": "tool", "callId": "t1"}, "content": [{"type": "tool-result", "toolCallId": "t1", "content": [image], "isError": false}]}),
        ];
        let block =
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4A=="}});
        let got = anthropic_messages(&messages, true);
        assert_eq!(got[0]["content"], json!([{"type": "text", "text": "see"}, block.clone()]));
        assert_eq!(got[2]["content"][0]["content"], json!([block]));
        let placeholder = json!({"type": "text", "text": "[image image/jpeg: not shown, this model takes no images]"});
        let got = anthropic_messages(&messages, false);
        assert_eq!(got[0]["content"][1], placeholder);
        assert_eq!(got[2]["content"][0]["content"], json!([placeholder]));
    }

    #[test]
    fn thinking_budget_stays_below_max_tokens() {
        assert_eq!(thinking_budget(None, 8192), None);
        assert_eq!(thinking_budget(Some("off"), 8192), None);
        assert_eq!(thinking_budget(Some("medium"), 8192), Some(4096));
        assert_eq!(thinking_budget(Some("high"), 8192), Some(7168));
        assert_eq!(thinking_budget(Some("2000"), 64_000), Some(2000));
        assert_eq!(thinking_budget(Some("low"), 1500), None);
    }
}
