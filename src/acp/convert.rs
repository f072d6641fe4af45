//! Conversions between ACP types and kin's session events and messages, and between ACP tool
//! kinds and what a call touches (`Access`).

use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema::SessionInfoUpdate;
use agent_client_protocol::v1::schema::{
    AvailableCommand, AvailableCommandInput, AvailableCommandsUpdate, ContentBlock, ContentChunk, Diff,
    EmbeddedResourceResource, ImageContent, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus, SessionUpdate,
    StopReason, TextContent, ToolCall, ToolCallContent, ToolCallLocation, ToolCallStatus, ToolCallUpdate,
    ToolCallUpdateFields, ToolKind, UnstructuredCommandInput,
};
use serde_json::{Value, json};

use crate::agent::TurnEnd;
use crate::model::StreamChunk;
use crate::session::EventBody;
use crate::session::event;
use crate::tools::capture::{Capture, Limits};
use crate::tools::{Access, ToolRegistry, image};

/// The most images one prompt may carry.
pub(crate) const MAX_PROMPT_IMAGES: usize = 20;
/// An embedded resource's text longer than this keeps its first and last half of it, with a
/// note of how much was left out.
pub(crate) const MAX_RESOURCE_BYTES: usize = 256 * 1024;

/// Prompt blocks → dsh content: text, resource links and embedded resources joined into text
/// blocks (a resource link becomes `\n[resource_link name=<json> uri=<json>]\n`, an embedded
/// text resource `\n[resource uri=<json>]\n<text>\n[/resource]\n`), each image (or embedded
/// image blob) an image block `{type: "image", mediaType, data}` in its place. Errors name the
/// block that cannot be taken and what to do instead.
pub(super) fn prompt_content(blocks: &[ContentBlock]) -> Result<Vec<Value>, String> {
    let mut content = Vec::new();
    let mut text = String::new();
    let mut images = 0;
    let mut image = |data: &str, number: usize, text: &mut String, content: &mut Vec<Value>| {
        images += 1;
        if images > MAX_PROMPT_IMAGES {
            return Err(format!(
                "a prompt may hold at most {MAX_PROMPT_IMAGES} images; send the others in a later prompt"
            ));
        }
        let format = image::check_base64(data).map_err(|why| {
            format!(
                "prompt block {number} (an image) cannot be sent: {why}; attach a {} image of at most {}",
                image::FORMATS,
                image::MAX_IMAGE_SHOWN
            )
        })?;
        if !text.is_empty() {
            content.push(json!({"type": "text", "text": std::mem::take(text)}));
        }
        content.push(json!({"type": "image", "mediaType": format.media_type(), "data": data.trim()}));
        Ok(())
    };
    for (index, block) in blocks.iter().enumerate() {
        let number = index + 1;
        match block {
            ContentBlock::Text(t) => text.push_str(&t.text),
            ContentBlock::ResourceLink(link) => {
                let (name, uri) = (quoted(&link.name), quoted(&link.uri));
                text.push_str(&format!("\n[resource_link name={name} uri={uri}]\n"));
            }
            ContentBlock::Image(picture) => image(&picture.data, number, &mut text, &mut content)?,
            ContentBlock::Resource(embedded) => match &embedded.resource {
                EmbeddedResourceResource::TextResourceContents(resource) => {
                    let uri = quoted(&resource.uri);
                    text.push_str(&format!("\n[resource uri={uri}]\n{}\n[/resource]\n", resource_text(&resource.text)));
                }
                // An image, by its type or (without one) by its bytes.
                EmbeddedResourceResource::BlobResourceContents(blob)
                    if blob
                        .mime_type
                        .as_deref()
                        .map_or_else(|| image::check_base64(&blob.blob).is_ok(), |m| m.starts_with("image/")) =>
                {
                    image(&blob.blob, number, &mut text, &mut content)?
                }
                // A text file sent as base64 is its text.
                EmbeddedResourceResource::BlobResourceContents(blob)
                    if let Some(decoded) = text_blob(blob.mime_type.as_deref(), &blob.blob) =>
                {
                    let uri = quoted(&blob.uri);
                    text.push_str(&format!("\n[resource uri={uri}]\n{}\n[/resource]\n", resource_text(&decoded)));
                }
                EmbeddedResourceResource::BlobResourceContents(blob) => {
                    let uri = quoted(&blob.uri);
                    let mime = quoted(blob.mime_type.as_deref().unwrap_or("unknown"));
                    let bytes = blob.blob.len() / 4 * 3;
                    text.push_str(&format!(
                        "\n[resource uri={uri} mimeType={mime}: about {bytes} bytes of binary data, not shown]\n"
                    ));
                }
                // `EmbeddedResourceResource` is non-exhaustive: a kind added to ACP later.
                _ => {
                    return Err(format!(
                        "prompt block {number} is a resource of a kind kin does not know; send its text"
                    ));
                }
            },
            ContentBlock::Audio(_) => {
                return Err(format!("prompt block {number} is audio, which kin does not take; send text or an image"));
            }
            // `ContentBlock` is non-exhaustive: a kind added to ACP later is not known here.
            _ => {
                return Err(format!(
                    "prompt block {number} is of a kind kin does not know; send text, images or resources"
                ));
            }
        }
    }
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    let has_text = content.iter().any(|b| b["text"].as_str().is_some_and(|t| !t.trim().is_empty()));
    if !has_text && images == 0 {
        return Err("empty prompt".into());
    }
    Ok(content)
}

/// An embedded resource's text, its first and last `MAX_RESOURCE_BYTES / 2` bytes when longer.
/// The most characters of an attachment's name, URI or media type a prompt keeps.
const MAX_NAME_CHARS: usize = 1024;

/// `value` as a JSON string, cut to `MAX_NAME_CHARS` with a note of what was left out.
fn quoted(value: &str) -> String {
    let kept = match value.char_indices().nth(MAX_NAME_CHARS) {
        Some((cut, _)) => format!("{}… [{} more characters not shown]", &value[..cut], value[cut..].chars().count()),
        None => value.to_string(),
    };
    serde_json::to_string(&kept).unwrap_or_default()
}

/// The text of a base64 blob whose media type says text (`text/*`, JSON, XML, YAML, TOML),
/// when it decodes to UTF-8.
fn text_blob(mime: Option<&str>, data: &str) -> Option<String> {
    use base64::Engine;
    let mime = mime?.split(';').next()?.trim().to_ascii_lowercase();
    let textual = mime.starts_with("text/")
        || ["json", "xml", "yaml", "toml", "javascript"].iter().any(|kind| mime.ends_with(kind))
        || mime.ends_with("+json")
        || mime.ends_with("+xml");
    if !textual {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(data.trim()).ok()?;
    String::from_utf8(bytes).ok()
}

fn resource_text(text: &str) -> String {
    let half = MAX_RESOURCE_BYTES / 2;
    let mut capture = Capture::new(Limits { head: half, tail: half });
    capture.push(text.as_bytes());
    capture.render()
}

/// The slash commands a session offers, as `available_commands_update` (a command's
/// `argument-hint` as its unstructured input hint).
pub(super) fn commands_update(commands: &[crate::slash::SlashCommand]) -> SessionUpdate {
    let available = commands
        .iter()
        .map(|c| {
            let input = c.hint.clone().map(|h| AvailableCommandInput::Unstructured(UnstructuredCommandInput::new(h)));
            AvailableCommand::new(c.name.clone(), c.description.clone()).input(input)
        })
        .collect();
    SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(available))
}

/// How the thought that shows a model retry begins (`kin run` picks retries out by it).
pub(crate) const RETRY_THOUGHT_PREFIX: &str = "Model request failed ";

/// Text from the agent that is not the model's (a command's answer).
pub(crate) fn agent_text(text: &str) -> SessionUpdate {
    SessionUpdate::AgentMessageChunk(text_chunk(text))
}

fn text_chunk(text: &str) -> ContentChunk {
    ContentChunk::new(ContentBlock::Text(TextContent::new(text)))
}

/// A dsh image block `{mediaType, data}` as ACP image content.
fn image_content(block: &Value) -> ContentBlock {
    let (data, media) = (block["data"].as_str().unwrap_or_default(), block["mediaType"].as_str().unwrap_or_default());
    ContentBlock::Image(ImageContent::new(data, media))
}

fn image_chunk(block: &Value) -> ContentChunk {
    ContentChunk::new(image_content(block))
}

/// The live update an appended event produces, if any: streamed text and reasoning deltas,
/// tool calls (shown as their tool among `tools` says) and their progress and results, plans,
/// retry notices, and compactions (thoughts: "Compacting conversation…", then the outcome).
/// `cwd` is the session's: the paths a call names are shown resolved against it.
pub(super) fn live_update(body: &EventBody, tools: &ToolRegistry, cwd: &Path) -> Option<SessionUpdate> {
    match body {
        EventBody::AssistantChunk(c) => chunk_update(&c.chunk),
        EventBody::ToolCall(call) => Some(tool_call_update(call, tools, cwd)),
        EventBody::ToolResult(result) => tool_result_update(result),
        EventBody::ToolProgress(progress) => Some(progress_update(progress)),
        EventBody::TodoWrite(plan) => Some(plan_update(plan)),
        EventBody::LlmRetry(retry) => Some(retry_update(retry)),
        EventBody::SessionTitle(title) => Some(title_update(title)),
        EventBody::CompactStart(_) => Some(thought(COMPACTING)),
        EventBody::CompactSummary(summary) => Some(compacted_update(summary)),
        EventBody::CompactEnd(end) => compact_failed_update(end),
        EventBody::TurnStart(_)
        | EventBody::UserMessage(_)
        | EventBody::SteeringMessage(_)
        | EventBody::StepStart(_)
        | EventBody::AssistantMessage(_)
        | EventBody::StepEnd(_)
        | EventBody::TurnEnd(_)
        | EventBody::SystemPrompt(_)
        | EventBody::SessionMode(_)
        | EventBody::SessionModel(_)
        | EventBody::SessionSandbox(_)
        | EventBody::McpServers(_)
        | EventBody::SessionEndSeed(_)
        | EventBody::SubagentDescriptor(_)
        | EventBody::SubagentRemoteRun(_)
        | EventBody::AgentInboxSpliced(_)
        | EventBody::Unknown { .. } => None,
    }
}

/// The updates that replay a stored event to a client loading the session: user prompts,
/// committed assistant text and reasoning, tool calls (as their tools among `tools` show them)
/// and results, plans, and each compaction's outcome (a thought, as it was shown live); paths
/// resolved against the session's `cwd`, as `live_update` does.
pub(super) fn replay_updates(body: &EventBody, tools: &ToolRegistry, cwd: &Path) -> Vec<SessionUpdate> {
    match body {
        EventBody::UserMessage(message) if message.is_from_user() => blocks(&message.content)
            .filter_map(|b| match b["type"].as_str() {
                Some("text") => Some(text_chunk(b["text"].as_str()?)),
                Some("image") => Some(image_chunk(b)),
                _ => None,
            })
            .map(SessionUpdate::UserMessageChunk)
            .collect(),
        EventBody::AssistantMessage(m) => blocks(&m.message.content)
            .filter_map(|b| {
                let text = b["text"].as_str().filter(|t| !t.is_empty())?;
                match b["type"].as_str() {
                    Some("text") => Some(SessionUpdate::AgentMessageChunk(text_chunk(text))),
                    Some("reasoning") => Some(SessionUpdate::AgentThoughtChunk(text_chunk(text))),
                    _ => None,
                }
            })
            .collect(),
        EventBody::ToolCall(call) => vec![tool_call_update(call, tools, cwd)],
        EventBody::ToolResult(result) => tool_result_update(result).into_iter().collect(),
        EventBody::TodoWrite(plan) => vec![plan_update(plan)],
        EventBody::SessionTitle(title) => vec![title_update(title)],
        EventBody::CompactSummary(summary) => vec![compacted_update(summary)],
        EventBody::CompactEnd(end) => compact_failed_update(end).into_iter().collect(),
        EventBody::UserMessage(_)
        | EventBody::TurnStart(_)
        | EventBody::SteeringMessage(_)
        | EventBody::StepStart(_)
        | EventBody::AssistantChunk(_)
        | EventBody::ToolProgress(_)
        | EventBody::StepEnd(_)
        | EventBody::TurnEnd(_)
        | EventBody::LlmRetry(_)
        | EventBody::SystemPrompt(_)
        | EventBody::SessionMode(_)
        | EventBody::SessionModel(_)
        | EventBody::SessionSandbox(_)
        | EventBody::McpServers(_)
        | EventBody::SessionEndSeed(_)
        | EventBody::SubagentDescriptor(_)
        | EventBody::SubagentRemoteRun(_)
        | EventBody::AgentInboxSpliced(_)
        | EventBody::CompactStart(_)
        | EventBody::Unknown { .. } => Vec::new(),
    }
}

/// `session/title` → `session_info_update` with the title.
fn title_update(title: &event::SessionTitle) -> SessionUpdate {
    SessionUpdate::SessionInfoUpdate(SessionInfoUpdate::new().title(title.title.clone()))
}

/// A streamed text or reasoning delta (an empty one shows nothing).
fn chunk_update(chunk: &StreamChunk) -> Option<SessionUpdate> {
    match chunk {
        StreamChunk::TextDelta { text, .. } if !text.is_empty() => {
            Some(SessionUpdate::AgentMessageChunk(text_chunk(text)))
        }
        StreamChunk::ReasoningDelta { text, .. } if !text.is_empty() => {
            Some(SessionUpdate::AgentThoughtChunk(text_chunk(text)))
        }
        StreamChunk::TextDelta { .. }
        | StreamChunk::ReasoningDelta { .. }
        | StreamChunk::BlockStart { .. }
        | StreamChunk::ToolCallDelta { .. }
        | StreamChunk::BlockEnd { .. }
        | StreamChunk::Usage { .. }
        | StreamChunk::Finish { .. } => None,
    }
}

/// `llm/retry` → a thought saying what failed and when the next attempt starts (and, when the
/// server asked for a longer wait, that it was capped).
fn retry_update(retry: &event::LlmRetry) -> SessionUpdate {
    let delay = retry.delay_ms as f64 / 1000.0;
    let capped = match retry.requested_delay_ms {
        Some(asked) => format!(
            "; the server asked to wait {:.1} s, capped at {delay:.1} s (model_settings.max_retry_after_secs)",
            asked as f64 / 1000.0
        ),
        None => String::new(),
    };
    let text = format!(
        "{RETRY_THOUGHT_PREFIX}({}); retrying in {delay:.1} s (attempt {} of {}{capped}).\n",
        retry.reason, retry.attempt, retry.max_attempts
    );
    SessionUpdate::AgentThoughtChunk(text_chunk(&text))
}

/// The thought a compaction starts with.
pub(crate) const COMPACTING: &str = "Compacting conversation…\n";

fn thought(text: &str) -> SessionUpdate {
    SessionUpdate::AgentThoughtChunk(text_chunk(text))
}

/// `compact/summary` → a thought with what was compacted: the items and their tokens before,
/// the checkpoint's after (estimates).
fn compacted_update(summary: &event::CompactSummary) -> SessionUpdate {
    let after = crate::agent::compact::checkpoint_tokens(&summary.summary);
    thought(&format!(
        "Compacted {} history items: ~{} tokens → ~{after} tokens.\n",
        summary.shadowed_seqs.len(),
        summary.shadowed_token_count
    ))
}

/// A failed `compact/end` → a thought with why (the history is as it was).
fn compact_failed_update(end: &event::CompactEnd) -> Option<SessionUpdate> {
    let error = end.error.as_deref()?;
    Some(thought(&format!("Compaction failed: {error}; the conversation is unchanged.\n")))
}

/// The directory a session's tool paths are shown against: its header's cwd (none: as named).
pub(super) fn cwd_of(header: &crate::session::SessionHeader) -> PathBuf {
    header.cwd.as_deref().map(PathBuf::from).unwrap_or_default()
}

/// `tool/call` → a `tool_call` (in progress, with the tool's title, the kind and locations of
/// what it touches as absolute paths, and the raw input).
fn tool_call_update(call: &event::ToolCall, tools: &ToolRegistry, cwd: &Path) -> SessionUpdate {
    let raw = call.arguments.as_str();
    let args: Value = serde_json::from_str(raw).unwrap_or_else(|_| json!(raw));
    let (title, access) = tools.shown(&call.name, &args);
    let mut update =
        ToolCall::new(call.call_id.clone(), title).kind(tool_kind(&access)).status(ToolCallStatus::InProgress);
    let locations = locations(&access, cwd);
    if !locations.is_empty() {
        update = update.locations(locations);
    }
    SessionUpdate::ToolCall(update.raw_input(shown_input(args)))
}

/// The most bytes of a call's raw input (as JSON) an editor is sent: a model's arguments can be
/// as long as its response (64 MiB), which the editor would hold and render in one frame.
pub(crate) const MAX_SHOWN_INPUT_BYTES: usize = 64 * 1024;

/// Each string of a longer raw input keeps its first and last bytes, the cut noted.
const SHOWN_INPUT_STRING: Limits = Limits { head: 2048, tail: 2048 };

/// A call's raw input as an editor is shown it: whole up to `MAX_SHOWN_INPUT_BYTES` of JSON; else
/// with each string cut to its ends (`SHOWN_INPUT_STRING`, the cut noted in it); else, when that
/// is still too long (a huge array or object), a string saying how long it was. The log and the
/// tool keep the input whole.
pub(super) fn shown_input(args: Value) -> Value {
    let size = json_len(&args);
    if size <= MAX_SHOWN_INPUT_BYTES {
        return args;
    }
    let cut = cut_strings(args);
    if json_len(&cut) <= MAX_SHOWN_INPUT_BYTES {
        return cut;
    }
    json!(format!("[raw input of {size} bytes not shown: longer than {MAX_SHOWN_INPUT_BYTES} bytes]"))
}

/// The length of `value` as compact JSON, counted without building the text.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}

/// `value` with each string longer than `SHOWN_INPUT_STRING` cut to its ends, the cut noted.
fn cut_strings(value: Value) -> Value {
    match value {
        Value::String(text) if text.len() > SHOWN_INPUT_STRING.total() => {
            Value::String(crate::tools::capture::ends_of(&text, SHOWN_INPUT_STRING))
        }
        Value::Array(items) => Value::Array(items.into_iter().map(cut_strings).collect()),
        Value::Object(fields) => Value::Object(fields.into_iter().map(|(key, v)| (key, cut_strings(v))).collect()),
        other => other,
    }
}

/// `tool/result` → a `tool_call_update` (completed or failed, with the result text, or the diff
/// a successful write or edit recorded in `data.meta.diff`, and the result's images).
fn tool_result_update(result: &event::ToolResult) -> Option<SessionUpdate> {
    let part = result.message.content.first()?;
    let text: String = blocks(&part.content).filter_map(|b| b["text"].as_str()).collect();
    let status = if part.is_error { ToolCallStatus::Failed } else { ToolCallStatus::Completed };
    let diff = result.meta.as_ref().and_then(|meta| diff_content(&meta["diff"]));
    let mut content = vec![match diff {
        Some(diff) if status == ToolCallStatus::Completed => diff,
        _ => ToolCallContent::from(ContentBlock::Text(TextContent::new(text))),
    }];
    // Images of a result (an MCP tool's) are shown too.
    for picture in blocks(&part.content).filter(|b| image::is_image(b)) {
        content.push(ToolCallContent::from(image_content(picture)));
    }
    // A command's sandbox note (`sandboxed: workspace-write`, or why it was not) comes first.
    if let Some(note) = result.meta.as_ref().and_then(|meta| meta["sandbox"].as_str()) {
        content.insert(0, ToolCallContent::from(ContentBlock::Text(TextContent::new(note))));
    }
    let mut fields = ToolCallUpdateFields::new().status(status).content(content);
    // Where a successful edit changed its file (`data.meta.location`, an absolute path).
    if let Some(location) = result.meta.as_ref().and_then(|meta| result_location(&meta["location"])) {
        fields = fields.locations(vec![location]);
    }
    Some(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(part.tool_call_id.clone(), fields)))
}

/// `tool/progress` → the running call's content: what it is doing now (live only; a loaded
/// session shows the call's result instead).
fn progress_update(progress: &event::ToolProgress) -> SessionUpdate {
    let content = ToolCallContent::from(ContentBlock::Text(TextContent::new(progress.text.as_str())));
    let fields = ToolCallUpdateFields::new().content(vec![content]);
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(progress.call_id.clone(), fields))
}

/// `{path, line?}` → a location.
fn result_location(location: &Value) -> Option<ToolCallLocation> {
    let path = location["path"].as_str()?;
    let line = location["line"].as_u64().and_then(|l| u32::try_from(l).ok());
    Some(ToolCallLocation::new(PathBuf::from(path)).line(line))
}

/// `{path, oldText, newText}` → diff content (`oldText` null: a new file).
fn diff_content(diff: &Value) -> Option<ToolCallContent> {
    let path = diff["path"].as_str()?;
    let new_text = diff["newText"].as_str()?;
    let old_text = diff["oldText"].as_str().map(str::to_string);
    Some(ToolCallContent::Diff(Diff::new(path, new_text).old_text(old_text)))
}

/// `todo/write` → the editor's plan.
fn plan_update(plan: &event::TodoWrite) -> SessionUpdate {
    let entries = plan
        .todos
        .iter()
        .map(|t| {
            let status = match t.status.as_str() {
                "completed" => PlanEntryStatus::Completed,
                "in_progress" => PlanEntryStatus::InProgress,
                _ => PlanEntryStatus::Pending,
            };
            PlanEntry::new(t.content.as_str(), PlanEntryPriority::Medium, status)
        })
        .collect();
    SessionUpdate::Plan(Plan::new(entries))
}

/// The ACP kind of what a call touches.
pub(super) fn tool_kind(access: &Access) -> ToolKind {
    match access {
        Access::Read { .. } => ToolKind::Read,
        Access::Search { .. } => ToolKind::Search,
        Access::Edit { .. } => ToolKind::Edit,
        Access::Delete { .. } => ToolKind::Delete,
        Access::Move { .. } => ToolKind::Move,
        Access::Execute { .. } | Access::ExecuteSandboxed { .. } => ToolKind::Execute,
        Access::Fetch => ToolKind::Fetch,
        Access::Plan => ToolKind::Think,
        Access::Delegate | Access::External => ToolKind::Other,
    }
}

/// The longest run of backticks in `text`.
fn longest_backticks(text: &str) -> usize {
    text.split(|c| c != '`').map(str::len).max().unwrap_or(0)
}

/// `text` as a markdown code span: delimited by more backticks than any run in it, padded with a
/// space where it starts or ends with one.
fn code_span(text: &str) -> String {
    let ticks = "`".repeat(longest_backticks(text) + 1);
    let pad = if text.starts_with('`') || text.ends_with('`') { " " } else { "" };
    format!("{ticks}{pad}{text}{pad}{ticks}")
}

/// How much of a command a permission request shows: its first and last bytes, the cut noted
/// in the block (the user can refuse a command too long to read).
const SHOWN_COMMAND: Limits = Limits { head: 32 * 1024, tail: 16 * 1024 };

/// What a permission request shows besides its title, which is cut: for a command, the command
/// (whole up to `SHOWN_COMMAND`) and the directory it runs in (`workdir` resolved against
/// `cwd`, the session's).
pub(super) fn request_content(access: &Access, cwd: &Path) -> Option<ToolCallContent> {
    let text = match access {
        Access::Execute { command, workdir } | Access::ExecuteSandboxed { command, workdir } if !command.is_empty() => {
            let dir = match workdir {
                Some(dir) => crate::tools::paths::resolve(cwd, &dir.to_string_lossy()),
                None => cwd.to_path_buf(),
            };
            // The directory as code on one line, so no markdown in its name (a fence, a comment
            // hiding what follows) is read as such.
            let dir = match dir.as_os_str().is_empty() {
                true => "the process directory".to_string(),
                false => code_span(&crate::tools::shown_on_one_line(&dir.display().to_string())),
            };
            // A fence longer than any run of backticks in the command, so the command cannot end it.
            let fence = "`".repeat(longest_backticks(command).max(2) + 1);
            let command = crate::tools::shown_plainly(command);
            let command = crate::tools::capture::ends_of(&command, SHOWN_COMMAND);
            format!("Working directory: {dir}\n\n{fence}sh\n{command}\n{fence}")
        }
        Access::Execute { .. }
        | Access::ExecuteSandboxed { .. }
        | Access::Read { .. }
        | Access::Search { .. }
        | Access::Edit { .. }
        | Access::Delete { .. }
        | Access::Move { .. }
        | Access::Fetch
        | Access::Delegate
        | Access::Plan
        | Access::External => return None,
    };
    Some(ToolCallContent::from(ContentBlock::Text(TextContent::new(text))))
}

/// The paths a call names as ACP locations, absolute (resolved against the session's `cwd`, as
/// the tools resolve them), a read's with the line it starts at (1 without an offset).
fn locations(access: &Access, cwd: &Path) -> Vec<ToolCallLocation> {
    let line = match access {
        // A read without an offset starts at the first line.
        Access::Read { line, .. } => u32::try_from(line.unwrap_or(1)).ok(),
        Access::Search { .. }
        | Access::Edit { .. }
        | Access::Delete { .. }
        | Access::Move { .. }
        | Access::Execute { .. }
        | Access::ExecuteSandboxed { .. }
        | Access::Fetch
        | Access::Delegate
        | Access::Plan
        | Access::External => None,
    };
    let absolute = |path: &PathBuf| crate::tools::paths::resolve(cwd, &path.to_string_lossy());
    access.paths().iter().map(|path| ToolCallLocation::new(absolute(path)).line(line)).collect()
}

/// What a call an external agent asks permission for touches, by the `kind` it declares, with the
/// paths it names: the one place such a question gets its `Access`, for the gate
/// (`Permissions::decide_forwarded`, through `acp::child`) and for the kind the editor is shown
/// (`tool_kind`). A kind kin has no word for is `External`: it asks (and read-only refuses it).
/// So is `think`: the kind cannot be checked, and a thought needs no permission, so a call that
/// asks for one is not taken for the agent's own planning (`Plan`, which every mode allows).
pub(super) fn access_of_kind(kind: ToolKind, paths: Vec<PathBuf>) -> Access {
    match kind {
        ToolKind::Read => Access::Read { paths, line: None },
        ToolKind::Search => Access::Search { paths },
        ToolKind::Edit => Access::Edit { paths },
        ToolKind::Delete => Access::Delete { paths },
        ToolKind::Move => Access::Move { paths },
        ToolKind::Execute => Access::Execute { command: String::new(), workdir: None },
        ToolKind::Fetch => Access::Fetch,
        ToolKind::Think | ToolKind::SwitchMode | ToolKind::Other => Access::External,
        // `ToolKind` is non-exhaustive: a kind added to ACP later is not known here.
        _ => Access::External,
    }
}

fn blocks(content: &[Value]) -> impl Iterator<Item = &Value> {
    content.iter()
}

/// A turn's end as an ACP stop reason; `Err` carries the failure message of an error turn.
pub(super) fn stop_reason(end: &TurnEnd) -> Result<StopReason, String> {
    match end {
        TurnEnd::Completed => Ok(StopReason::EndTurn),
        TurnEnd::MaxTokens => Ok(StopReason::MaxTokens),
        TurnEnd::Aborted | TurnEnd::Disposed => Ok(StopReason::Cancelled),
        TurnEnd::StepLimit(_) => Ok(StopReason::MaxTurnRequests),
        TurnEnd::Error(message) => Err(message.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed body of an event read from the log.
    fn event(kind: &str, data: Value) -> EventBody {
        let event = crate::session::Event {
            kind: kind.into(),
            seq: 0,
            time: 0,
            data: data.into(),
            source_event_seqs: None,
            surface_op: None,
        };
        event.body()
    }

    fn result(is_error: bool, meta: Option<Value>) -> EventBody {
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
        let update =
            serde_json::to_value(live_update(&progress, &ToolRegistry::new(), Path::new("/ws")).unwrap()).unwrap();
        assert_eq!(update["sessionUpdate"], "tool_call_update");
        assert_eq!(update["toolCallId"], "c1");
        assert!(update.get("status").is_none(), "{update}");
        assert_eq!(
            update["content"],
            json!([{"type": "content", "content": {"type": "text", "text": "acp:x: Run tests"}}])
        );
        assert!(replay_updates(&progress, &ToolRegistry::new(), Path::new("/ws")).is_empty(), "not replayed on load");
    }

    #[test]
    fn a_compaction_shows_as_thoughts_and_only_its_outcome_replays() {
        let tools = ToolRegistry::new();
        let shown = |update: Option<SessionUpdate>| {
            let wire = serde_json::to_value(update.unwrap()).unwrap();
            assert_eq!(wire["sessionUpdate"], "agent_thought_chunk", "{wire}");
            wire["content"]["text"].as_str().unwrap().to_string()
        };
        let start = event("compact/start", json!({"turn": null}));
        assert_eq!(shown(live_update(&start, &tools, Path::new("/ws"))), "Compacting conversation…\n");
        assert!(replay_updates(&start, &tools, Path::new("/ws")).is_empty(), "a start is not replayed");
        let summary = json!({
            "summary": [{"type": "text", "text": "S"}], "shadowedRange": {"start": 1, "end": 4},
            "shadowedSeqs": [1, 2, 4], "shadowedTokenCount": 900, "provider": "p", "model": "m",
        });
        let summary = event("compact/summary", summary);
        let after = crate::agent::compact::checkpoint_tokens(&[json!({"type": "text", "text": "S"})]);
        let outcome = format!("Compacted 3 history items: ~900 tokens → ~{after} tokens.\n");
        assert_eq!(shown(live_update(&summary, &tools, Path::new("/ws"))), outcome);
        assert_eq!(shown(replay_updates(&summary, &tools, Path::new("/ws")).into_iter().next()), outcome);
        let failed = event("compact/end", json!({"turn": 2, "error": "summary model down"}));
        let why = "Compaction failed: summary model down; the conversation is unchanged.\n";
        assert_eq!(shown(live_update(&failed, &tools, Path::new("/ws"))), why);
        assert_eq!(shown(replay_updates(&failed, &tools, Path::new("/ws")).into_iter().next()), why);
        let done = event("compact/end", json!({"turn": 2}));
        assert!(
            live_update(&done, &tools, Path::new("/ws")).is_none()
                && replay_updates(&done, &tools, Path::new("/ws")).is_empty()
        );
    }

    #[test]
    fn a_retry_notice_says_when_the_servers_wait_was_capped() {
        let text = |data: Value| {
            let wire = serde_json::to_value(
                live_update(&event("llm/retry", data), &ToolRegistry::new(), Path::new("/ws")).unwrap(),
            )
            .unwrap();
            wire["content"]["text"].as_str().unwrap().to_string()
        };
        let retry = json!({"attempt": 2, "maxAttempts": 4, "delayMs": 60000, "reason": "rate limited (HTTP 429)"});
        assert_eq!(
            text(retry.clone()),
            "Model request failed (rate limited (HTTP 429)); retrying in 60.0 s (attempt 2 of 4).\n"
        );
        let mut capped = retry;
        capped["requestedDelayMs"] = json!(3_600_000);
        assert_eq!(
            text(capped),
            "Model request failed (rate limited (HTTP 429)); retrying in 60.0 s (attempt 2 of 4; the server \
             asked to wait 3600.0 s, capped at 60.0 s (model_settings.max_retry_after_secs)).\n"
        );
    }

    #[test]
    fn a_write_result_with_a_diff_shows_the_diff() {
        let meta = json!({"diff": {"path": "/w/a.txt", "oldText": "a\n", "newText": "b\n"}});
        let update = live_update(&result(false, Some(meta)), &ToolRegistry::new(), Path::new("/ws")).unwrap();
        let wire = serde_json::to_value(&update).unwrap();
        assert_eq!(wire["sessionUpdate"], "tool_call_update");
        assert_eq!(wire["status"], "completed");
        assert_eq!(wire["content"], json!([{"type": "diff", "path": "/w/a.txt", "oldText": "a\n", "newText": "b\n"}]));
        let created = json!({"diff": {"path": "/w/n.txt", "oldText": null, "newText": "n\n"}});
        let wire = serde_json::to_value(
            live_update(&result(false, Some(created)), &ToolRegistry::new(), Path::new("/ws")).unwrap(),
        )
        .unwrap();
        assert_eq!(wire["content"][0]["type"], "diff");
        assert!(wire["content"][0].get("oldText").is_none_or(Value::is_null));
    }

    #[test]
    fn other_results_show_their_text() {
        let wire =
            serde_json::to_value(live_update(&result(false, None), &ToolRegistry::new(), Path::new("/ws")).unwrap())
                .unwrap();
        assert_eq!(
            wire["content"],
            json!([{"type": "content", "content": {"type": "text", "text": "Edited /w/a.txt"}}])
        );
        let meta = json!({"diff": {"path": "/w/a.txt", "oldText": "a\n", "newText": "b\n"}});
        let wire = serde_json::to_value(
            live_update(&result(true, Some(meta)), &ToolRegistry::new(), Path::new("/ws")).unwrap(),
        )
        .unwrap();
        assert_eq!(wire["status"], "failed");
        assert_eq!(wire["content"][0]["type"], "content");
    }

    fn call(name: &str, arguments: Value) -> Value {
        let mut tools = ToolRegistry::new();
        crate::tools::builtin::register_coding_tools(&mut tools, crate::tools::fs::FileState::default());
        let data = json!({"turn": 1, "step": 1, "callId": "c1", "name": name, "arguments": arguments.to_string()});
        serde_json::to_value(live_update(&event("tool/call", data), &tools, Path::new("/ws")).unwrap()).unwrap()
    }

    #[test]
    fn a_tool_call_shows_its_tools_title_kind_and_locations() {
        let read = call("read", json!({"file_path": "src/a.rs", "offset": 12}));
        assert_eq!(read["title"], "Read src/a.rs");
        assert_eq!(read["kind"], "read");
        assert_eq!(read["locations"], json!([{"path": "/ws/src/a.rs", "line": 12}]), "absolute, with the line");
        assert_eq!(read["rawInput"], json!({"file_path": "src/a.rs", "offset": 12}));
        let grep = call("grep", json!({"pattern": "fn", "path": "src"}));
        assert_eq!((&grep["title"], &grep["kind"]), (&json!("grep fn in src"), &json!("search")));
        assert_eq!(grep["locations"], json!([{"path": "/ws/src"}]));
        let outside = call("read", json!({"file_path": "/etc/hosts"}));
        assert_eq!(outside["locations"], json!([{"path": "/etc/hosts", "line": 1}]), "an absolute path stays as it is");
        let edit = call("edit", json!({"file_path": "../b.rs", "old_string": "a", "new_string": "b"}));
        assert_eq!(edit["locations"], json!([{"path": "/b.rs"}]), "the line of an edit comes with its result");
        let bash = call("bash", json!({"command": "ls", "description": "List"}));
        assert_eq!((&bash["title"], &bash["kind"]), (&json!("Run `ls`"), &json!("execute")));
        assert!(bash.get("locations").is_none(), "{bash}");
        assert_eq!(call("todo_write", json!({"todos": []}))["kind"], "think");
        let unknown = call("mcp_tool", json!({"path": "x"}));
        assert_eq!(unknown["title"], "mcp_tool");
        assert!(unknown.get("kind").is_none(), "`other`, the default kind, is left out: {unknown}");
        assert!(unknown.get("locations").is_none(), "{unknown}");
    }

    #[test]
    fn a_huge_raw_input_reaches_the_editor_cut_and_saying_so() {
        let content = format!("first line\n{}\nlast line", "y".repeat(5_000_000));
        let write = call("write", json!({"file_path": "big.txt", "content": content}));
        let shown = &write["rawInput"];
        assert!(shown.to_string().len() <= MAX_SHOWN_INPUT_BYTES, "bounded");
        assert_eq!(shown["file_path"], "big.txt", "short fields stay whole");
        let text = shown["content"].as_str().unwrap();
        assert!(text.starts_with("first line\n") && text.ends_with("\nlast line"), "its ends are kept");
        assert!(text.contains(&format!("[... {} bytes omitted ...]", content.len() - 4096)), "{}", &text[2040..2100]);
        // Too many fields to cut down: a note of how long it was instead.
        let many: Vec<String> = (0..20_000).map(|i| format!("item {i}")).collect();
        let wide = call("todo_write", json!({"todos": many}));
        let note = wide["rawInput"].as_str().unwrap();
        assert!(note.starts_with("[raw input of ") && note.ends_with(" bytes not shown: longer than 65536 bytes]"));
        // Up to the limit, the input is shown whole.
        let edge = json!({"content": "z".repeat(MAX_SHOWN_INPUT_BYTES - 20)});
        assert_eq!(shown_input(edge.clone()), edge);
    }

    #[test]
    fn forwarded_kinds_map_to_access_and_back() {
        let paths = || vec![PathBuf::from("/w/a")];
        // As a kind arrives on the wire (`other` for one this schema does not know).
        let forwarded_access = |kind: &str, paths| {
            access_of_kind(serde_json::from_value(json!(kind)).expect("ToolKind reads any string"), paths)
        };
        for (kind, access) in [
            ("read", Access::Read { paths: paths(), line: None }),
            ("search", Access::Search { paths: paths() }),
            ("edit", Access::Edit { paths: paths() }),
            ("delete", Access::Delete { paths: paths() }),
            ("move", Access::Move { paths: paths() }),
            ("execute", Access::Execute { command: String::new(), workdir: None }),
            ("fetch", Access::Fetch),
            ("think", Access::External),
            ("switch_mode", Access::External),
            ("other", Access::External),
            ("teleport", Access::External),
        ] {
            assert_eq!(forwarded_access(kind, paths()), access, "{kind}");
        }
        for kind in ["read", "search", "edit", "delete", "move", "execute", "fetch", "other"] {
            let shown = serde_json::to_value(tool_kind(&forwarded_access(kind, Vec::new()))).unwrap();
            assert_eq!(shown, kind, "a forwarded question keeps its kind");
        }
    }

    #[test]
    fn a_forwarded_think_is_asked_about_and_refused_in_read_only() {
        use crate::permission::{PermissionAnswer, PermissionMode, Permissions};
        let think = access_of_kind(ToolKind::Think, vec![PathBuf::from("/w/a")]);
        let decided = |mode| Permissions::new(mode).decide_forwarded(&think, true, std::path::Path::new("/ws"));
        assert_eq!(decided(PermissionMode::Ask), None, "asked");
        assert_eq!(decided(PermissionMode::AcceptEdits), None, "asked");
        assert_eq!(decided(PermissionMode::ReadOnly), Some(PermissionAnswer::RejectOnce));
        let shown = serde_json::to_value(tool_kind(&think)).unwrap();
        assert_eq!(shown, "other", "shown as a call kin cannot see into");
    }

    #[test]
    fn events_kin_does_not_understand_show_nothing() {
        let tools = ToolRegistry::new();
        let hook = event("hook/invoked", json!({"title": "t"}));
        assert!(
            live_update(&hook, &tools, Path::new("/ws")).is_none()
                && replay_updates(&hook, &tools, Path::new("/ws")).is_empty()
        );
        let nameless = event("tool/call", json!({"turn": 1, "step": 1, "callId": 7}));
        assert!(matches!(nameless, EventBody::Unknown { .. }), "a call id must be a string");
        assert!(
            live_update(&nameless, &tools, Path::new("/ws")).is_none()
                && replay_updates(&nameless, &tools, Path::new("/ws")).is_empty()
        );
    }

    fn blocks_of(wire: Value) -> Vec<ContentBlock> {
        serde_json::from_value(wire).unwrap()
    }

    const PNG: &str = "iVBORw0KGgoAAAANSUhEUg==";

    #[test]
    fn a_prompt_keeps_its_images_in_place_and_embeds_resources_as_text() {
        let prompt = blocks_of(json!([
            {"type": "text", "text": "Look at "},
            {"type": "resource", "resource": {"uri": "file:///w/a.rs", "text": "fn main() {}", "mimeType": "text/x-rust"}},
            {"type": "image", "data": PNG, "mimeType": "image/png"},
            {"type": "text", "text": "and "},
            {"type": "resource_link", "name": "b.rs", "uri": "file:///w/b.rs"},
            {"type": "resource", "resource": {"uri": "file:///w/c.png", "blob": PNG, "mimeType": "image/png"}},
            {"type": "resource", "resource": {"uri": "file:///w/d.bin", "blob": "AAAA", "mimeType": "application/octet-stream"}},
        ]));
        let content = prompt_content(&prompt).unwrap();
        assert_eq!(
            content,
            vec![
                json!({"type": "text", "text": "Look at \n[resource uri=\"file:///w/a.rs\"]\nfn main() {}\n[/resource]\n"}),
                json!({"type": "image", "mediaType": "image/png", "data": PNG}),
                json!({"type": "text", "text": "and \n[resource_link name=\"b.rs\" uri=\"file:///w/b.rs\"]\n"}),
                json!({"type": "image", "mediaType": "image/png", "data": PNG}),
                json!({"type": "text", "text": "\n[resource uri=\"file:///w/d.bin\" mimeType=\"application/octet-stream\": about 3 bytes of binary data, not shown]\n"}),
            ]
        );
        // An image alone is a prompt; a text-only prompt is one text block, as before.
        let alone =
            prompt_content(&blocks_of(json!([{"type": "image", "data": PNG, "mimeType": "image/png"}]))).unwrap();
        assert_eq!(alone.len(), 1);
        assert_eq!(
            prompt_content(&blocks_of(json!([{"type": "text", "text": "hi"}]))).unwrap(),
            vec![json!({"type": "text", "text": "hi"})]
        );
        // What load shows of it: the text and the images, in order.
        let message = crate::session::event::UserMessage::new(content, json!({"kind": "user"}));
        let shown: Vec<Value> =
            replay_updates(&EventBody::UserMessage(message), &ToolRegistry::new(), Path::new("/ws"))
                .into_iter()
                .map(|u| serde_json::to_value(u).unwrap()["content"]["type"].clone())
                .collect();
        assert_eq!(shown, ["text", "image", "text", "image", "text"]);
    }

    /// A text file sent as base64 is its text; an image blob without a type is told by its bytes;
    /// an attachment's name, URI and type are cut to 1,024 characters, saying so.
    #[test]
    fn blobs_are_read_for_what_they_are_and_attachment_names_are_capped() {
        use base64::Engine;
        let notes = base64::engine::general_purpose::STANDARD.encode("line one\nline two");
        let prompt = blocks_of(json!([
            {"type": "text", "text": "See"},
            {"type": "resource", "resource": {"uri": "file:///w/n.txt", "blob": notes, "mimeType": "text/plain; charset=utf-8"}},
            {"type": "resource", "resource": {"uri": "file:///w/p", "blob": PNG}},
        ]));
        let content = prompt_content(&prompt).unwrap();
        assert_eq!(content[0]["text"], "See\n[resource uri=\"file:///w/n.txt\"]\nline one\nline two\n[/resource]\n");
        assert_eq!(content[1], json!({"type": "image", "mediaType": "image/png", "data": PNG}));
        let long = "x".repeat(3 << 20);
        let prompt = blocks_of(json!([
            {"type": "resource_link", "name": long, "uri": long},
            {"type": "resource", "resource": {"uri": "file:///w/d.bin", "blob": "AAAA", "mimeType": long}},
        ]));
        let text = prompt_content(&prompt).unwrap()[0]["text"].as_str().unwrap().to_string();
        assert!(text.len() < 8 * 1024, "{}", text.len());
        let note = format!("… [{} more characters not shown]", (3 << 20) - 1024);
        assert_eq!(text.matches(&note).count(), 3, "{text:.200}");
    }

    #[test]
    fn a_bad_image_or_audio_is_refused_by_its_place() {
        let refused = |wire: Value| prompt_content(&blocks_of(wire)).unwrap_err();
        assert_eq!(
            refused(json!([{"type": "text", "text": "x"}, {"type": "image", "data": "AAAA", "mimeType": "image/png"}])),
            "prompt block 2 (an image) cannot be sent: it is not a PNG, JPEG, GIF or WebP image (its data starts \
             with 00 00 00); attach a PNG, JPEG, GIF or WebP image of at most 3.75 MiB"
        );
        assert_eq!(
            refused(json!([{"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}])),
            "prompt block 1 is audio, which kin does not take; send text or an image"
        );
        let many: Vec<Value> =
            (0..=MAX_PROMPT_IMAGES).map(|_| json!({"type": "image", "data": PNG, "mimeType": "image/png"})).collect();
        assert!(refused(Value::Array(many)).starts_with("a prompt may hold at most 20 images"));
        assert_eq!(refused(json!([{"type": "text", "text": "  "}])), "empty prompt");
    }

    #[test]
    fn a_long_embedded_resource_keeps_its_head_and_tail() {
        let text = format!("{}{}", "a".repeat(MAX_RESOURCE_BYTES), "z".repeat(10));
        let prompt = blocks_of(json!([{"type": "resource", "resource": {"uri": "file:///w/big", "text": text}}]));
        let content = prompt_content(&prompt).unwrap();
        let shown = content[0]["text"].as_str().unwrap();
        assert!(shown.contains("[... 10 bytes omitted ...]"), "the cut says so");
        assert!(shown.ends_with("zzzzzzzzzz\n[/resource]\n"), "the tail is kept");
        assert!(shown.len() < MAX_RESOURCE_BYTES + 200);
    }

    #[test]
    fn todo_write_is_a_plan() {
        let todos = json!({"todos": [
            {"content": "Read", "status": "completed"},
            {"content": "Fix", "status": "in_progress"},
            {"content": "Test", "status": "pending"}
        ]});
        let wire = serde_json::to_value(
            live_update(&event("todo/write", todos), &ToolRegistry::new(), Path::new("/ws")).unwrap(),
        )
        .unwrap();
        assert_eq!(wire["sessionUpdate"], "plan");
        let statuses: Vec<&str> =
            wire["entries"].as_array().unwrap().iter().map(|e| e["status"].as_str().unwrap()).collect();
        assert_eq!(statuses, ["completed", "in_progress", "pending"]);
    }
}
