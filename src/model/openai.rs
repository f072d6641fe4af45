//! The OpenAI-compatible Chat Completions client (`POST {base}/chat/completions`, streaming):
//! DeepSeek, OpenAI and any compatible server (Ollama, vLLM, llama.cpp). dsh messages become
//! chat messages (system first, tool calls as `tool_calls`, tool results as `role: tool`), and
//! the SSE deltas become dsh chunks: text and `reasoning_content` blocks, tool calls assembled
//! from indexed deltas with raw JSON arguments, usage, and the finish reason.

use super::sse::Event;
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::http::{self, Api, AttemptError, Decoder, HttpModel, Server};
use super::utf16::{self, Joiner};
use super::{Failure, FinishReason, ModelRequest, StreamChunk};
use crate::tools::image;

/// How to reach one OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// The client posts to `{base_url}/chat/completions`, with `Authorization: Bearer <key>`.
    pub server: Server,
    /// `max_tokens` for every request; None lets the server decide.
    pub max_tokens: Option<u32>,
    /// Sent as `reasoning_effort`; `off` disables DeepSeek thinking (`thinking.type: disabled`).
    pub reasoning_effort: Option<String>,
    /// Speak DeepSeek's dialect: send `reasoning_content` back on the current turn's tool-call
    /// steps, and the `thinking` switch.
    pub deepseek: bool,
    /// The model takes images: a prompt's as `image_url` parts, a tool result's in a user
    /// message after the tool messages (tool messages take no images). Otherwise each image is a
    /// placeholder text.
    pub images: bool,
}

impl OpenAiConfig {
    /// A config with the server's defaults, no `max_tokens` or reasoning effort, not DeepSeek,
    /// taking images.
    pub fn new(server: Server) -> Self {
        OpenAiConfig { server, max_tokens: None, reasoning_effort: None, deepseek: false, images: true }
    }
}

/// A model behind an OpenAI-compatible Chat Completions endpoint.
pub type OpenAiModel = HttpModel<OpenAiConfig>;

impl Api for OpenAiConfig {
    type Decoder = ChatDecoder;
    const PATH: &'static str = "/chat/completions";
    const MODELS_PATH: &'static str = "/models";

    fn server(&self) -> &Server {
        &self.server
    }

    fn auth(key: &str) -> Result<(HeaderName, HeaderValue), Failure> {
        Ok((AUTHORIZATION, http::secret_value(&format!("Bearer {key}"))?))
    }

    /// The JSON body of the request for one call.
    fn request_body(&self, request: &ModelRequest) -> Value {
        let mut body = json!({
            "model": request.route.model,
            "messages": chat_messages(request, self.deepseek, self.images),
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": tool.name,
                            "description": tool.description,
                            "parameters": tool.parameters,
                        },
                    })
                })
                .collect();
        }
        if let Some(max_tokens) = request.max_tokens.or(self.max_tokens) {
            body["max_tokens"] = max_tokens.into();
        }
        match self.reasoning_effort.as_deref() {
            None => {}
            Some("off" | "none" | "disabled") if self.deepseek => {
                body["thinking"] = json!({"type": "disabled"});
            }
            Some("off" | "disabled") => {}
            Some(effort) => body["reasoning_effort"] = effort.into(),
        }
        body
    }
}

/// The texts of the blocks of one kind (`text`, `reasoning`), joined.
fn joined(blocks: &[Value], kind: &str, separator: &str) -> String {
    blocks
        .iter()
        .filter(|b| b["type"] == kind)
        .filter_map(|b| b["text"].as_str())
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(separator)
}

fn blocks_of(message: &Value) -> &[Value] {
    message["content"].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A user message that starts a turn (or steers it): any user message but a tool result.
fn is_prompt(message: &Value) -> bool {
    message["role"] == "user" && !blocks_of(message).iter().any(|b| b["type"] == "tool-result")
}

/// Raw JSON arguments as the API wants them (a JSON text, `{}` when empty).
fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(text) if !text.trim().is_empty() => text.clone(),
        Value::String(_) | Value::Null => "{}".into(),
        other => other.to_string(),
    }
}

/// A tool result as the text a `tool` message carries: its text blocks, and for each image a
/// note (tool messages take no images: a model that takes images gets them in a user message
/// after the tool messages, `images`).
fn tool_result_text(blocks: &[Value], images: bool) -> String {
    blocks
        .iter()
        .filter_map(|b| match b["type"].as_str() {
            Some("text") => b["text"].as_str().filter(|t| !t.is_empty()).map(str::to_string),
            Some("image") if images => Some(format!(
                "[image {}: attached to the next user message]",
                b["mediaType"].as_str().unwrap_or("image")
            )),
            Some("image") => Some(image::placeholder(b["mediaType"].as_str().unwrap_or("image"))),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A dsh image block as a Chat Completions `image_url` part (a data URL).
fn image_part(block: &Value) -> Value {
    let media = block["mediaType"].as_str().unwrap_or("image/png");
    let data = block["data"].as_str().unwrap_or_default();
    json!({"type": "image_url", "image_url": {"url": format!("data:{media};base64,{data}")}})
}

/// The content of a user message: its text as a string, or, when it holds images a model that
/// takes them sees, text and `image_url` parts in order. For a model that takes no images, each
/// is a placeholder in the text. `None` when there is nothing to send.
fn user_content(blocks: &[&Value], images: bool) -> Option<Value> {
    let shows_images = images && blocks.iter().any(|b| b["type"] == "image");
    if !shows_images {
        let text = blocks
            .iter()
            .filter_map(|b| match b["type"].as_str() {
                Some("text") => b["text"].as_str().filter(|t| !t.is_empty()).map(str::to_string),
                Some("image") => Some(image::placeholder(b["mediaType"].as_str().unwrap_or("image"))),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n");
        return (!text.is_empty()).then_some(Value::String(text));
    }
    let parts: Vec<Value> = blocks
        .iter()
        .filter_map(|b| match b["type"].as_str() {
            Some("text") => b["text"].as_str().filter(|t| !t.is_empty()).map(|t| json!({"type": "text", "text": t})),
            Some("image") => Some(image_part(b)),
            _ => None,
        })
        .collect();
    Some(Value::Array(parts))
}

/// dsh messages as Chat Completions messages.
fn chat_messages(request: &ModelRequest, deepseek: bool, images: bool) -> Vec<Value> {
    let mut out = Vec::new();
    if !request.system.is_empty() {
        out.push(json!({"role": "system", "content": request.system}));
    }
    // The images of a run of tool results, sent in one user message after its tool messages.
    let mut result_images: Vec<Value> = Vec::new();
    let flush = |out: &mut Vec<Value>, result_images: &mut Vec<Value>| {
        if result_images.is_empty() {
            return;
        }
        let mut parts = vec![json!({"type": "text", "text": "The images the tool results above refer to:"})];
        parts.extend(result_images.drain(..).map(|b| image_part(&b)));
        out.push(json!({"role": "user", "content": parts}));
    };
    // DeepSeek wants the reasoning of the current turn's tool-call steps back, and only those.
    let turn_start = request.messages.iter().rposition(is_prompt);
    for (position, message) in request.messages.iter().enumerate() {
        let blocks = blocks_of(message);
        let results: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "tool-result").collect();
        if results.is_empty() {
            flush(&mut out, &mut result_images);
        }
        match message["role"].as_str() {
            Some("assistant") => {
                let text = joined(blocks, "text", "\n");
                let calls: Vec<Value> = blocks
                    .iter()
                    .filter(|b| b["type"] == "tool-call")
                    .map(|b| {
                        json!({
                            "id": b["id"],
                            "type": "function",
                            "function": {"name": b["name"], "arguments": arguments_text(&b["arguments"])},
                        })
                    })
                    .collect();
                if text.is_empty() && calls.is_empty() {
                    continue;
                }
                let content = if text.is_empty() { Value::Null } else { Value::String(text) };
                let mut entry = json!({"role": "assistant", "content": content});
                let reasoning = joined(blocks, "reasoning", "");
                let current_turn = turn_start.is_none_or(|start| position > start);
                if deepseek && current_turn && !calls.is_empty() && !reasoning.is_empty() {
                    entry["reasoning_content"] = reasoning.into();
                }
                if !calls.is_empty() {
                    entry["tool_calls"] = calls.into();
                }
                out.push(entry);
            }
            Some("system") => {
                let text = joined(blocks, "text", "\n");
                if !text.is_empty() {
                    out.push(json!({"role": "system", "content": text}));
                }
            }
            _ => {
                for result in results {
                    let result_blocks = blocks_of(result);
                    out.push(json!({
                        "role": "tool",
                        "tool_call_id": result["toolCallId"],
                        "content": tool_result_text(result_blocks, images),
                    }));
                    if images {
                        result_images.extend(result_blocks.iter().filter(|b| b["type"] == "image").cloned());
                    }
                }
                let own: Vec<&Value> = blocks.iter().filter(|b| b["type"] != "tool-result").collect();
                if let Some(content) = user_content(&own, images) {
                    flush(&mut out, &mut result_images);
                    out.push(json!({"role": "user", "content": content}));
                }
            }
        }
    }
    flush(&mut out, &mut result_images);
    out
}

/// The text or reasoning block being streamed.
struct OpenBlock {
    index: u64,
    reasoning: bool,
    text: String,
    /// Surrogate halves held across events.
    join: Joiner,
}

/// A tool call being assembled from its deltas.
struct PendingCall {
    /// Our block index.
    index: u64,
    id: String,
    /// The server gave `id` (else kin made it up).
    id_given: bool,
    name: String,
    arguments: String,
    /// Surrogate halves of the arguments held across events.
    join: Joiner,
}

/// Chat Completions SSE → dsh chunks.
#[derive(Default)]
pub struct ChatDecoder {
    next_index: u64,
    open: Option<OpenBlock>,
    /// Tool calls stay open until the finish (deltas of parallel calls may interleave).
    calls: Vec<PendingCall>,
    /// Where each call's `index` key is in `calls` (a delta finds its call in constant time,
    /// however many a response sends).
    positions: foldhash::HashMap<u64, usize>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    /// The event being decoded used surrogate stand-ins (see `utf16::parse_event`).
    marked: bool,
}

/// The text delta of a block.
fn text_delta(reasoning: bool, index: u64, text: String) -> StreamChunk {
    if reasoning { StreamChunk::ReasoningDelta { index, text } } else { StreamChunk::TextDelta { index, text } }
}

impl ChatDecoder {
    fn close_open(&mut self, out: &mut Vec<StreamChunk>) {
        if let Some(mut block) = self.open.take() {
            if let Some(tail) = block.join.finish() {
                block.text.push(tail);
                out.push(text_delta(block.reasoning, block.index, tail.to_string()));
            }
            let kind = if block.reasoning { "reasoning" } else { "text" };
            out.push(StreamChunk::BlockEnd { index: block.index, block: json!({"type": kind, "text": block.text}) });
        }
    }

    fn new_index(&mut self) -> u64 {
        let index = self.next_index;
        self.next_index += 1;
        index
    }

    fn text(&mut self, piece: &str, reasoning: bool, out: &mut Vec<StreamChunk>) {
        if piece.is_empty() {
            return;
        }
        if self.open.as_ref().is_none_or(|b| b.reasoning != reasoning) {
            self.close_open(out);
            let index = self.new_index();
            let kind = if reasoning { "reasoning" } else { "text" };
            out.push(StreamChunk::BlockStart { index, block_type: kind.into() });
            self.open = Some(OpenBlock { index, reasoning, text: String::new(), join: Joiner::default() });
        }
        if let Some(block) = &mut self.open {
            let piece = block.join.piece(piece, self.marked);
            if piece.is_empty() {
                // Only a surrogate half, held for the next event.
                return;
            }
            block.text.push_str(&piece);
            out.push(text_delta(reasoning, block.index, piece.into_owned()));
        }
    }

    fn tool_call(&mut self, position: usize, delta: &Value, out: &mut Vec<StreamChunk>) {
        let key = delta["index"].as_u64().unwrap_or(position as u64);
        let name_piece = Joiner::whole(delta["function"]["name"].as_str().unwrap_or_default(), self.marked);
        let raw_arguments = match &delta["function"]["arguments"] {
            Value::String(text) => text.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        let marked = self.marked;
        let given_id = delta["id"].as_str().filter(|id| !id.is_empty());
        // A delta at a call's position (its `index`, or its place in the list when a server
        // sends none) continues that call, unless it names another id: then it starts a call of
        // its own, which takes the position over.
        let continued = self.positions.get(&key).map(|&at| &mut self.calls[at]).filter(|call| {
            !(call.id_given && given_id.is_some_and(|id| Joiner::whole(id, marked) != call.id.as_str()))
        });
        if let Some(call) = continued {
            let arguments_piece = call.join.piece(&raw_arguments, marked).into_owned();
            call.arguments.push_str(&arguments_piece);
            // Some servers repeat the name on every delta: only the first one counts.
            let name = (call.name.is_empty() && !name_piece.is_empty()).then(|| {
                call.name = name_piece.to_string();
                call.name.clone()
            });
            if name.is_some() || !arguments_piece.is_empty() {
                out.push(StreamChunk::ToolCallDelta {
                    index: call.index,
                    id: call.id.clone(),
                    name,
                    arguments_delta: arguments_piece,
                });
            }
            return;
        }
        self.close_open(out);
        let index = self.new_index();
        let id = given_id.map_or_else(
            || format!("call_{}", uuid::Uuid::new_v4().simple()),
            |id| Joiner::whole(id, marked).into_owned(),
        );
        let mut join = Joiner::default();
        let arguments_piece = join.piece(&raw_arguments, marked).into_owned();
        out.push(StreamChunk::BlockStart { index, block_type: "tool-call".into() });
        out.push(StreamChunk::ToolCallDelta {
            index,
            id: id.clone(),
            name: Some(name_piece.to_string()),
            arguments_delta: arguments_piece.clone(),
        });
        self.positions.insert(key, self.calls.len());
        let id_given = given_id.is_some();
        self.calls.push(PendingCall {
            index,
            id,
            id_given,
            name: name_piece.into_owned(),
            arguments: arguments_piece,
            join,
        });
    }

    /// Closes the blocks and appends usage and the finish.
    fn finish(&mut self, out: &mut Vec<StreamChunk>) -> Result<(), AttemptError> {
        let reason = self.finish_reason.take().unwrap_or_default();
        if reason == "insufficient_system_resource" {
            return Err(AttemptError::new(
                http::SERVER_ERROR,
                "the provider ran out of capacity mid-response (finish_reason insufficient_system_resource)",
            ));
        }
        self.close_open(out);
        let has_calls = !self.calls.is_empty();
        self.positions.clear();
        for mut call in self.calls.drain(..) {
            if let Some(tail) = call.join.finish() {
                call.arguments.push(tail);
                let id = call.id.clone();
                out.push(StreamChunk::ToolCallDelta {
                    index: call.index,
                    id,
                    name: None,
                    arguments_delta: tail.into(),
                });
            }
            let arguments = if call.arguments.trim().is_empty() { "{}".to_string() } else { call.arguments };
            out.push(StreamChunk::BlockEnd {
                index: call.index,
                block: json!({"type": "tool-call", "id": call.id, "name": call.name, "arguments": arguments}),
            });
        }
        if let Some(usage) = self.usage.take() {
            out.push(StreamChunk::Usage { usage });
        }
        let reason = match reason.as_str() {
            "length" => FinishReason::MaxTokens,
            "content_filter" => FinishReason::Error {
                failure: Failure::new("the provider's content filter stopped the response", http::CONTENT_FILTERED),
            },
            _ if has_calls => FinishReason::ToolCalls,
            _ => FinishReason::Stop,
        };
        out.push(StreamChunk::Finish { reason, replay_state: None });
        Ok(())
    }
}

/// Chat Completions usage as dsh usage.
fn dsh_usage(usage: &Value) -> Value {
    let mut mapped = json!({
        "inputTokens": usage["prompt_tokens"].as_u64().unwrap_or(0),
        "outputTokens": usage["completion_tokens"].as_u64().unwrap_or(0),
    });
    let cached =
        usage["prompt_cache_hit_tokens"].as_u64().or_else(|| usage["prompt_tokens_details"]["cached_tokens"].as_u64());
    if let Some(cached) = cached {
        mapped["cacheReadTokens"] = cached.into();
    }
    if let Some(reasoning) = usage["completion_tokens_details"]["reasoning_tokens"].as_u64() {
        mapped["reasoningTokens"] = reasoning.into();
    }
    mapped
}

impl Decoder for ChatDecoder {
    fn event(&mut self, event: &Event, out: &mut Vec<StreamChunk>) -> Result<bool, AttemptError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.finish(out)?;
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let (value, marked) = utf16::parse_event(data).map_err(|e| http::unreadable(data, &e))?;
        self.marked = marked;
        if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
            return Err(http::stream_error(error));
        }
        if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(dsh_usage(usage));
        }
        for choice in value["choices"].as_array().into_iter().flatten() {
            if choice["index"].as_u64().unwrap_or(0) != 0 {
                continue;
            }
            let delta = &choice["delta"];
            let reasoning =
                delta["reasoning_content"].as_str().or_else(|| delta["reasoning"].as_str()).unwrap_or_default();
            self.text(reasoning, true, out);
            self.text(delta["content"].as_str().unwrap_or_default(), false, out);
            for (position, call) in delta["tool_calls"].as_array().into_iter().flatten().enumerate() {
                self.tool_call(position, call, out);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finish_reason = Some(reason.to_string());
            }
        }
        Ok(false)
    }

    fn end(&mut self, out: &mut Vec<StreamChunk>) -> Result<(), AttemptError> {
        // Some servers close the stream after the finish without `[DONE]`: that is complete.
        if self.finish_reason.is_none() {
            return Err(http::incomplete());
        }
        self.finish(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelRoute, ToolSchema};

    fn request(messages: Vec<Value>) -> ModelRequest {
        ModelRequest {
            session_id: "s".into(),
            turn: 2,
            step: 2,
            cwd: None,
            route: ModelRoute { provider: "deepseek".into(), model: "deepseek-v4-flash".into() },
            system: "sys".into(),
            messages: std::sync::Arc::new(messages),
            tools: vec![ToolSchema {
                name: "read".into(),
                description: "Read a file".into(),
                parameters: json!({"type": "object"}),
            }],
            purpose: crate::model::Purpose::Step,
            max_tokens: None,
        }
    }

    fn decode(events: &[&str]) -> Result<Vec<StreamChunk>, String> {
        let mut decoder = ChatDecoder::default();
        let mut out = Vec::new();
        for data in events {
            let event = Event { data: (*data).to_string(), ..Event::default() };
            if decoder.event(&event, &mut out).map_err(|e| e.failure.code)? {
                return Ok(out);
            }
        }
        decoder.end(&mut out).map_err(|e| e.failure.code)?;
        Ok(out)
    }

    #[test]
    fn reasoning_goes_back_only_for_the_current_turns_tool_steps() {
        let messages = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "one"}], "source": {"kind": "user"}}),
            json!({"role": "assistant", "content": [{"type": "reasoning", "text": "old"}, {"type": "tool-call", "id": "a", "name": "read", "arguments": "{}"}]}),
            json!({"role": "user", "source": {"kind": "tool", "callId": "a"}, "content": [{"type": "tool-result", "toolCallId": "a", "content": [{"type": "text", "text": "r1"}], "isError": false}]}),
            json!({"role": "assistant", "content": [{"type": "reasoning", "text": "old2"}, {"type": "text", "text": "done"}]}),
            json!({"role": "user", "content": [{"type": "text", "text": "two"}], "source": {"kind": "user"}}),
            json!({"role": "assistant", "content": [{"type": "reasoning", "text": "new"}, {"type": "tool-call", "id": "b", "name": "read", "arguments": ""}]}),
            json!({"role": "user", "source": {"kind": "tool", "callId": "b"}, "content": [{"type": "tool-result", "toolCallId": "b", "content": [{"type": "text", "text": "r2"}], "isError": true}]}),
        ];
        let got = chat_messages(&request(messages), true, false);
        assert_eq!(
            got,
            vec![
                json!({"role": "system", "content": "sys"}),
                json!({"role": "user", "content": "one"}),
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": "a", "content": "r1"}),
                json!({"role": "assistant", "content": "done"}),
                json!({"role": "user", "content": "two"}),
                json!({"role": "assistant", "content": null, "reasoning_content": "new", "tool_calls": [{"id": "b", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": "b", "content": "r2"}),
            ]
        );
    }

    fn image() -> Value {
        json!({"type": "image", "mediaType": "image/png", "data": "iVBORw0KGgo="})
    }

    #[test]
    fn a_prompts_images_are_image_url_parts_or_placeholders() {
        let prompt = json!({"role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": "What is this?"}, image()]});
        let got = chat_messages(&request(vec![prompt.clone()]), false, true);
        assert_eq!(
            got[1],
            json!({"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ]})
        );
        let got = chat_messages(&request(vec![prompt]), true, false);
        assert_eq!(
            got[1],
            json!({"role": "user", "content": "What is this?\n[image image/png: not shown, this model takes no images]"})
        );
    }

    #[test]
    fn tool_result_images_follow_the_tool_messages_in_one_user_message() {
        let result = |id: &str, content: Vec<Value>| json!({"role": "user", "source": {"kind": "tool", "callId": id}, "content": [{"type": "tool-result", "toolCallId": id, "content": content, "isError": false}]});
        let messages = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "look"}], "source": {"kind": "user"}}),
            json!({"role": "assistant", "content": [{"type": "tool-call", "id": "a", "name": "read", "arguments": "{}"}, {"type": "tool-call", "id": "b", "name": "read", "arguments": "{}"}]}),
            result("a", vec![json!({"type": "text", "text": "Image a.png"}), image()]),
            result("b", vec![json!({"type": "text", "text": "r2"})]),
        ];
        let got = chat_messages(&request(messages.clone()), false, true);
        assert_eq!(
            got[3],
            json!({"role": "tool", "tool_call_id": "a", "content": "Image a.png\n[image image/png: attached to the next user message]"})
        );
        assert_eq!(
            got[4],
            json!({"role": "tool", "tool_call_id": "b", "content": "r2"}),
            "the tool messages stay together"
        );
        assert_eq!(
            got[5],
            json!({"role": "user", "content": [
                {"type": "text", "text": "The images the tool results above refer to:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ]})
        );
        assert_eq!(got.len(), 6);
        let got = chat_messages(&request(messages), true, false);
        assert_eq!(got[3]["content"], "Image a.png\n[image image/png: not shown, this model takes no images]");
        assert_eq!(got.len(), 5, "no user message for a model that takes no images");
    }

    #[test]
    fn a_request_cap_replaces_the_configured_max_tokens() {
        let mut config = OpenAiConfig::new(crate::model::http::Server::new("http://127.0.0.1:1", None));
        config.max_tokens = Some(1000);
        assert_eq!(config.request_body(&request(Vec::new()))["max_tokens"], 1000);
        let summary = ModelRequest { max_tokens: Some(8192), ..request(Vec::new()) };
        assert_eq!(config.request_body(&summary)["max_tokens"], 8192);
    }

    /// Each call a server streams is a call of its own, however it numbers them: without
    /// `index` (each delta's place in its list is 0), or reusing an index for a new id; a delta
    /// without an id, or repeating its call's id, continues its call.
    #[test]
    fn tool_calls_are_told_apart_by_id_when_the_index_does_not() {
        let call = |index: Option<u64>, id: Option<&str>, name: Option<&str>, args: &str| {
            let mut delta = json!({"function": {"arguments": args}});
            if let Some(index) = index {
                delta["index"] = json!(index);
            }
            if let Some(id) = id {
                delta["id"] = json!(id);
            }
            if let Some(name) = name {
                delta["function"]["name"] = json!(name);
            }
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]}).to_string()
        };
        let stop = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#.to_string();
        let calls = |events: Vec<String>| -> Vec<(String, String)> {
            let refs: Vec<&str> = events.iter().map(String::as_str).collect();
            let mut calls: Vec<(String, String)> = Vec::new();
            for chunk in decode(&refs).unwrap() {
                if let StreamChunk::ToolCallDelta { id, arguments_delta, .. } = chunk {
                    match calls.iter_mut().find(|(known, _)| *known == id) {
                        Some((_, args)) => args.push_str(&arguments_delta),
                        None => calls.push((id, arguments_delta)),
                    }
                }
            }
            calls
        };
        let a = r#"{"path": "a.txt"}"#;
        let b = r#"{"path": "b.txt"}"#;
        let expected = vec![("c1".to_string(), a.to_string()), ("c2".to_string(), b.to_string())];
        // No index at all.
        let no_index =
            vec![call(None, Some("c1"), Some("read"), a), call(None, Some("c2"), Some("read"), b), stop.clone()];
        assert_eq!(calls(no_index), expected);
        // Index 0 reused for a new id.
        let reused =
            vec![call(Some(0), Some("c1"), Some("read"), a), call(Some(0), Some("c2"), Some("read"), b), stop.clone()];
        assert_eq!(calls(reused), expected);
        // A call streamed in pieces, its id on the first delta only, or repeated on each.
        let pieces = vec![
            call(Some(0), Some("c1"), Some("read"), r#"{"path": "#),
            call(Some(0), None, None, r#""a.txt"}"#),
            call(Some(1), Some("c2"), Some("read"), r#"{"path": "#),
            call(Some(1), Some("c2"), None, r#""b.txt"}"#),
            stop,
        ];
        assert_eq!(calls(pieces), expected);
    }

    #[test]
    fn finish_without_done_completes_but_no_finish_is_incomplete() {
        let text = r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#;
        let stop = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
        let chunks = decode(&[text, stop]).unwrap();
        assert_eq!(chunks.last(), Some(&StreamChunk::Finish { reason: FinishReason::Stop, replay_state: None }));
        assert_eq!(decode(&[text]), Err(http::STREAM_INCOMPLETE.to_string()));
        // An empty completion is passed on as it came: the agent's step retries it.
        let empty = decode(&[stop, "[DONE]"]).unwrap();
        assert_eq!(empty, [StreamChunk::Finish { reason: FinishReason::Stop, replay_state: None }]);
    }
}
