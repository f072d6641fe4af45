//! The event bodies kin writes and reads, declared once (the table at the end of this file):
//! `Kind` names every event type kin knows, and any other type by name (`Kind::Other`);
//! `EventBody` is the closed enum of their payloads, one typed struct per kind, plus `Unknown`.
//!
//! Producers build typed payloads and append them (`Session::push`); `session/` turns them into
//! the wire `data`. Readers ask an event for its typed body (`Event::body`, exhaustive) or for
//! one payload (`Event::get`). An event keeps its `data` exactly as it was read or written, so a
//! log round-trips line for line whatever it holds: fields kin does not model, shapes it does
//! not expect and kinds it does not know are never lost. A typed read is lenient: fields kin
//! does not need default when absent, extra fields are ignored, and a payload whose needed fields
//! do not fit reads as `EventBody::Unknown` (kin ignores it, as it ignores an unknown kind).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::chunk::{Failure, StreamChunk};
use super::data::Data;
use super::record::Event;

/// A typed payload: the `data` of one kind of event.
pub trait Payload: Serialize + DeserializeOwned + Into<EventBody> {
    const KIND: Kind;
}

impl Event {
    /// A new event with this body: a surface kind with `surfaceOp: "append"`, any other kind
    /// log-only; `sources` are the events it was built from (`sourceEventSeqs`).
    pub fn new(seq: u64, time: u64, body: impl Into<EventBody>, sources: Option<Vec<u64>>) -> Event {
        let (kind, data) = body.into().into_parts();
        let surface_op = kind.is_surface().then(|| Value::from("append"));
        Event { kind, seq, time, data, source_event_seqs: sources, surface_op }
    }

    /// The typed body of this event (`Unknown` for a kind kin does not know or a payload that
    /// does not fit its kind).
    pub fn body(&self) -> EventBody {
        EventBody::read(&self.kind, &self.data)
    }

    /// The payload of an event of `T`'s kind; `None` for another kind or a payload that does not
    /// fit.
    pub fn get<T: Payload>(&self) -> Option<T> {
        if self.kind != T::KIND {
            return None;
        }
        self.data.read().ok()
    }

    /// The message a surface event puts into the model history (`data` for `user/message`,
    /// `data.message` for the other surface kinds; `null` when it has none), parsed afresh;
    /// `None` for log-only events.
    pub fn surface_message(&self) -> Option<Value> {
        super::surface::HistoryMessage::of(self).map(|m| m.value())
    }
}

/// The payload of the last event of `T`'s kind (`None` when there is none, or when that one
/// does not fit).
pub(crate) fn last<T: Payload>(events: &[Event]) -> Option<T> {
    events.iter().rev().find(|e| e.kind == T::KIND)?.get()
}

impl Kind {
    /// True for the four surface kinds, whose `surfaceOp` puts a message into the model history.
    pub fn is_surface(&self) -> bool {
        matches!(self, Kind::UserMessage | Kind::AssistantMessage | Kind::ToolResult | Kind::SteeringMessage)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for Kind {
    fn from(name: &str) -> Self {
        Kind::parse(name)
    }
}

impl PartialEq<&str> for Kind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for Kind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Kind;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an event type name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Kind, E> {
                Ok(Kind::parse(name))
            }
        }
        deserializer.deserialize_str(Name)
    }
}

fn unknown_error() -> String {
    "unknown error".into()
}

fn user_role() -> String {
    "user".into()
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `turn/start`: a turn begins (turns are numbered from 1 across the whole log).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnStart {
    #[serde(default)]
    pub turn: u64,
    #[serde(default)]
    pub trigger: Trigger,
}

/// What started a turn: `{kind: "message", source}` for a queued message, `{kind: "retry"}` for
/// the turn that retries a turn the context window overflowed (after compaction).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub source: Value,
}

impl Trigger {
    /// The trigger of a turn run for a message from `source`.
    pub fn message(source: Value) -> Self {
        Trigger { kind: "message".into(), source }
    }

    /// The trigger of a turn that retries the previous one.
    pub fn retry() -> Self {
        Trigger { kind: "retry".into(), source: Value::Null }
    }
}

/// `user/message` (surface; the data is the message itself): a dsh `UserMessage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserMessage {
    #[serde(default)]
    pub content: Vec<Value>,
    /// Who sent it: `{kind: "user"}` for a prompt, other kinds for messages between sessions.
    #[serde(default)]
    pub source: Value,
    #[serde(default = "user_role")]
    pub role: String,
    #[serde(default)]
    pub id: String,
}

impl UserMessage {
    /// A new message with a fresh id.
    pub fn new(content: Vec<Value>, source: Value) -> Self {
        UserMessage { content, source, role: user_role(), id: new_id() }
    }

    /// True when the user (the editor's prompt) sent it.
    pub fn is_from_user(&self) -> bool {
        self.source["kind"] == "user"
    }
}

/// `steering/message` (surface, dsh's): read for the model history only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SteeringMessage {
    #[serde(default)]
    pub turn: u64,
    #[serde(default)]
    pub message: Value,
}

/// `step/start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepStart {
    #[serde(default)]
    pub turn: u64,
    #[serde(default)]
    pub step: u64,
}

/// `step/end`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEnd {
    #[serde(default)]
    pub turn: u64,
    #[serde(default)]
    pub step: u64,
}

/// `assistant/chunk`: one streamed chunk, exactly as the model produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantChunk {
    #[serde(default)]
    pub turn: u64,
    #[serde(default)]
    pub step: u64,
    pub chunk: StreamChunk,
}

/// `assistant/message` (surface; `sourceEventSeqs` are the step's chunks): the finished answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    #[serde(default)]
    pub turn: u64,
    #[serde(default)]
    pub step: u64,
    pub message: ModelMessage,
    /// The provider's token counts (`inputTokens`, `outputTokens`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
}

/// The message of an `assistant/message`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelMessage {
    #[serde(default)]
    pub role: String,
    /// The finished blocks in index order: `text`, `reasoning`, `tool-call`.
    #[serde(default)]
    pub content: Vec<Value>,
    #[serde(default)]
    pub source: ModelSource,
    #[serde(default)]
    pub id: String,
}

/// `{kind: "model", provider, model}`: which model wrote a message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSource {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub model: String,
}

/// A `tool-call` block of an assistant message: what the model asked to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallBlock {
    pub id: String,
    pub name: String,
    /// The raw JSON text of the arguments, as the model wrote it.
    pub arguments: String,
}

impl ModelMessage {
    /// A new message of `provider`/`model` with a fresh id.
    pub fn new(content: Vec<Value>, provider: &str, model: &str) -> Self {
        let source = ModelSource { kind: "model".into(), provider: provider.into(), model: model.into() };
        ModelMessage { role: "assistant".into(), content, source, id: new_id() }
    }

    /// The `tool-call` blocks, in order (a missing field reads as empty).
    pub fn tool_calls(&self) -> Vec<ToolCallBlock> {
        self.content
            .iter()
            .filter(|b| b["type"] == "tool-call")
            .map(|b| {
                let text = |k: &str| b[k].as_str().unwrap_or_default().to_string();
                ToolCallBlock { id: text("id"), name: text("name"), arguments: text("arguments") }
            })
            .collect()
    }

    /// True when the message has no content (it takes no place in the model history).
    pub fn is_empty(&self) -> bool {
        self.content.is_empty()
    }
}

/// `tool/call` (log-only): a call about to run. All calls of a batch are written first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    #[serde(default)]
    pub turn: u64,
    #[serde(default)]
    pub step: u64,
    pub call_id: String,
    /// The tool's name (`tool` when a log has none).
    #[serde(default = "unnamed_tool")]
    pub name: String,
    /// The raw JSON text of the arguments.
    #[serde(default)]
    pub arguments: String,
}

fn unnamed_tool() -> String {
    "tool".into()
}

/// `tool/progress` (log-only, kin's own): what a running call is doing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolProgress {
    #[serde(default)]
    pub turn: u64,
    #[serde(default)]
    pub step: u64,
    pub call_id: String,
    pub text: String,
}

/// `tool/result` (surface; `sourceEventSeqs` is the `tool/call`): a call's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    #[serde(default)]
    pub turn: u64,
    #[serde(default)]
    pub step: u64,
    pub message: ToolResultMessage,
    /// Why a failed call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ToolFailure>,
    /// What only the editor sees (dsh's field): `{diff: {path, oldText, newText}}` of a write or edit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

/// What a `tool/result` says of its call, read without building its content: the call's id and
/// whether the call failed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolOutcome {
    pub(crate) call_id: String,
    pub(crate) failed: bool,
}

impl ToolOutcome {
    /// The outcome a `tool/result` event records; `None` for another kind or a payload that
    /// does not fit.
    pub(crate) fn of(event: &Event) -> Option<ToolOutcome> {
        #[derive(Deserialize)]
        struct Outcome {
            message: OutcomeMessage,
            #[serde(default)]
            error: Option<serde::de::IgnoredAny>,
        }
        #[derive(Deserialize)]
        struct OutcomeMessage {
            #[serde(default)]
            source: ToolSource,
        }
        if event.kind != Kind::ToolResult {
            return None;
        }
        let outcome: Outcome = event.data.read().ok()?;
        Some(ToolOutcome { call_id: outcome.message.source.call_id, failed: outcome.error.is_some() })
    }
}

/// The message of a `tool/result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResultMessage {
    #[serde(default)]
    pub source: ToolSource,
    pub content: Vec<ToolResultPart>,
    #[serde(default = "user_role")]
    pub role: String,
    #[serde(default)]
    pub id: String,
}

/// `{kind: "tool", callId}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSource {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub call_id: String,
}

/// One `tool-result` part: the result blocks of one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResultPart {
    #[serde(rename = "type", default)]
    pub part_type: String,
    pub tool_call_id: String,
    #[serde(default)]
    pub content: Vec<Value>,
    #[serde(default)]
    pub is_error: bool,
}

/// `{name, code}` of a failed call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolFailure {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub code: String,
}

impl ToolResult {
    /// The result of call `call_id`: its blocks, whether it failed (and why) and its editor-only
    /// `meta`; a fresh message id.
    pub fn new(
        turn: u64,
        step: u64,
        call_id: &str,
        content: Vec<Value>,
        error: Option<ToolFailure>,
        meta: Option<Value>,
    ) -> Self {
        let part = ToolResultPart {
            part_type: "tool-result".into(),
            tool_call_id: call_id.into(),
            content,
            is_error: error.is_some(),
        };
        let message = ToolResultMessage {
            source: ToolSource { kind: "tool".into(), call_id: call_id.into() },
            content: vec![part],
            role: user_role(),
            id: new_id(),
        };
        ToolResult { turn, step, message, error, meta }
    }

    /// The call this result answers (its first part's `toolCallId`).
    pub fn call_id(&self) -> Option<&str> {
        self.message.content.first().map(|p| p.tool_call_id.as_str())
    }
}

/// `turn/end`: how a turn ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnEnd {
    #[serde(default)]
    pub turn: u64,
    #[serde(default)]
    pub reason: TurnEndReason,
}

/// dsh `TurnEndReason`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TurnEndReason {
    /// The model answered without asking for tools.
    Completed,
    /// The stream finished with `max-tokens`.
    MaxTokens,
    /// Cancelled by the user or a parent.
    Aborted,
    /// The agent was shut down during the turn.
    Disposed,
    /// The model failed, or the turn ran out of steps (`STEP_LIMIT`). dsh may write
    /// `message`/`code` instead of `failure`; kin always writes `step` and `failure`.
    Error {
        #[serde(default)]
        step: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
    },
    /// Written only by crash repair.
    Interrupted,
    /// A reason kin does not know (read only; never written).
    #[default]
    #[serde(other, skip_serializing)]
    Unrecognized,
}

impl TurnEndReason {
    /// The wire name of the reason (`?` for one kin does not know).
    pub fn name(&self) -> &'static str {
        match self {
            TurnEndReason::Completed => "completed",
            TurnEndReason::MaxTokens => "max-tokens",
            TurnEndReason::Aborted => "aborted",
            TurnEndReason::Disposed => "disposed",
            TurnEndReason::Error { .. } => "error",
            TurnEndReason::Interrupted => "interrupted",
            TurnEndReason::Unrecognized => "?",
        }
    }
}

/// `llm/retry` (log-only, kin's own): a failed model request about to be retried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlmRetry {
    /// The turn of the retried call; `null` for a `/compact` summary between turns (as its
    /// `compact/start` says), which consumes no turn number.
    #[serde(default)]
    pub turn: Option<u64>,
    #[serde(default)]
    pub step: u64,
    /// The attempt about to start (2 for the first retry).
    #[serde(default)]
    pub attempt: u32,
    #[serde(default)]
    pub max_attempts: u32,
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default)]
    pub code: String,
    /// The failed attempt's message.
    #[serde(default = "unknown_error")]
    pub reason: String,
    /// The wait the server asked for, when it was longer than the cap allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_delay_ms: Option<u64>,
}

/// `system/prompt` (log-only): the session's system prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemPrompt {
    pub text: String,
}

/// `todo/write` (log-only): the model's task list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TodoWrite {
    #[serde(default)]
    pub todos: Vec<Todo>,
}

/// One entry of a task list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Todo {
    #[serde(default)]
    pub content: String,
    /// `pending`, `in_progress` or `completed`.
    #[serde(default)]
    pub status: String,
}

/// `session/mode` (log-only): the permission mode chosen with `session/set_mode`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionMode {
    pub mode: String,
}

/// `session/model` (log-only): the model route chosen in the editor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionModel {
    pub provider: String,
    pub model: String,
}

/// `session/sandbox` (log-only, kin's own): the sandbox chosen for the session's commands with
/// its `sandbox` config option.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxChoice {
    /// `off`, `read-only` or `workspace-write`.
    pub level: String,
    pub network: bool,
}

/// `mcp/servers` (log-only, kin's own): the MCP servers a session was given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpServers {
    #[serde(default)]
    pub servers: Vec<McpServer>,
}

/// One MCP server as the log records it: never anything that may hold a secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpServer {
    pub name: String,
    /// `stdio`, `http`, or an unsupported kind (`sse`).
    pub kind: String,
    /// `editor` or `config`.
    pub origin: String,
}

/// `session/end-seed` (log-only marker): everything before it came from a seed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndSeed {}

/// `subagent/descriptor`: a child's durable identity. The payload is kept as written; its
/// versioned, strict reading is `subagent::Descriptor::parse`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DescriptorPayload(pub Value);

/// `subagent/remote-run` (log-only, kin's own): a run of an external ACP agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteRun {
    pub run_id: String,
    pub provider: String,
    /// The program name only (no arguments or environment).
    pub command: String,
    pub child_session_id: String,
    pub output: String,
    pub stop_reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `agent/inbox/spliced` (log-only; dsh's later durable inbox): one change to a pending list of
/// the receiving agent, written before the change takes effect. The lists and their fold are
/// `session::inbox`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxSplice {
    pub target: InboxTarget,
    /// Where in the target list the change starts.
    pub start: u64,
    /// How many pending messages from `start` on it removes (written only when not 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub removed_count: u64,
    /// The messages it inserts at `start`, in order.
    #[serde(default)]
    pub inserted: Vec<UserMessage>,
    /// `canceled` when the removed messages are discarded; absent when a turn (or a step) took
    /// them (a claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<InboxOutcome>,
}

/// Which pending list a splice changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InboxTarget {
    /// Messages waiting for their own turn (a follow-up, a waking report), in FIFO order.
    NextTurn,
    /// Messages waiting for the next step of the running turn (a quiet report).
    NextStep,
}

/// What became of removed messages that no turn took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InboxOutcome {
    Canceled,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `compact/start` (log-only, dsh's): a compaction begins. `turn` is the open turn it runs in
/// (automatic: at a step's start, or after a context overflow), `None` (`null`) for `/compact`
/// between turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactStart {
    #[serde(default)]
    pub turn: Option<u64>,
}

/// The first and last shadowed node of a compaction (seqs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SeqRange {
    pub start: u64,
    pub end: u64,
}

/// `compact/summary` (log-only, dsh's): the summary a compaction's model call produced, what it
/// shadows, and which model wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactSummary {
    /// The text blocks of the answer.
    #[serde(default)]
    pub summary: Vec<Value>,
    /// Every block of the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_output: Option<Vec<Value>>,
    #[serde(default)]
    pub shadowed_range: SeqRange,
    /// The seq of every shadowed node, in surface order (authoritative; the range is its ends).
    #[serde(default)]
    pub shadowed_seqs: Vec<u64>,
    /// The estimated tokens of the shadowed nodes.
    #[serde(default)]
    pub shadowed_token_count: u64,
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
}

/// `compact/end` (log-only, dsh's): the compaction that started with the matching
/// `compact/start` is over; `error` says why it failed (the surface is then unchanged).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactEnd {
    #[serde(default)]
    pub turn: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `session/title` (log-only, dsh's shape): what the session is called. The first prompt gives
/// a fallback title (its first five words); a model may write a better one after the first turn.
/// The last one in the log is the session's title.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionTitle {
    pub title: String,
    /// The messages the title was made from.
    #[serde(default)]
    pub message_seqs: Vec<u64>,
    #[serde(default)]
    pub source: TitleSource,
}

/// Who made a title: `{kind: "fallback"}` (the first words of the prompt) or `{kind: "model",
/// provider, model}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TitleSource {
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// The user's own words in a prompt's text: without the attachments written into it (by
/// `acp::convert`: `[resource uri=…]` … `[/resource]`, and the one-line `[resource …]` and
/// `[resource_link …]` notes), whose contents (a file's, a secret in it) make no title.
/// Whether a prompt's text holds an attachment `acp::convert` wrote into it (the lines
/// `own_words` leaves out).
pub(crate) fn has_attachment(text: &str) -> bool {
    text.split('\n')
        .any(|line| (line.starts_with("[resource uri=") || line.starts_with("[resource_link ")) && line.ends_with(']'))
}

pub(crate) fn own_words(text: &str) -> String {
    let mut own = String::with_capacity(text.len().min(1024));
    let mut attached = false;
    for line in text.split('\n') {
        if attached {
            attached = line != "[/resource]";
        } else if line.starts_with("[resource uri=") && line.ends_with(']') {
            attached = !line.ends_with("not shown]");
        } else if !(line.starts_with("[resource_link ") && line.ends_with(']')) {
            own.push_str(line);
            own.push('\n');
        }
    }
    own
}

/// How many words of the first prompt a fallback title keeps (dsh's rule).
const FALLBACK_WORDS: usize = 5;
/// The longest title kin writes, in characters.
pub(crate) const MAX_TITLE_CHARS: usize = 100;

impl SessionTitle {
    /// The fallback title of a prompt (message `seq`): its first five words (at most
    /// `MAX_TITLE_CHARS` characters); `None` when the prompt has no text.
    pub fn fallback(message: &UserMessage, seq: u64) -> Option<Self> {
        let texts: Vec<&str> = message.content.iter().filter_map(|b| b["text"].as_str()).collect();
        Self::fallback_of(&texts, seq)
    }

    /// `fallback` of a prompt's texts (what the user typed, for a slash command's expansion).
    pub fn fallback_of(texts: &[&str], seq: u64) -> Option<Self> {
        let text: Vec<String> = texts.iter().map(|t| own_words(t)).collect();
        // Control characters (an escape sequence pasted into a prompt) count as spaces: a title
        // is printed to terminals and shown in lists.
        let text: Vec<String> = text.iter().map(|t| t.replace(char::is_control, " ")).collect();
        let words: Vec<&str> = text.iter().flat_map(|t| t.split_whitespace()).take(FALLBACK_WORDS).collect();
        if words.is_empty() {
            return None;
        }
        let title = cut_title(&words.join(" "));
        Some(SessionTitle {
            title,
            message_seqs: vec![seq],
            source: TitleSource { kind: "fallback".into(), ..TitleSource::default() },
        })
    }

    /// A title a model wrote (trimmed and cut to `MAX_TITLE_CHARS`); `None` when it is blank.
    pub fn by_model(title: &str, message_seqs: Vec<u64>, provider: &str, model: &str) -> Option<Self> {
        let title = title.replace(char::is_control, " ").split_whitespace().collect::<Vec<_>>().join(" ");
        let title = title.trim_matches(|c: char| c == '"' || c == '\'' || c == '`' || c == '*').trim();
        if title.is_empty() {
            return None;
        }
        let source = TitleSource { kind: "model".into(), provider: Some(provider.into()), model: Some(model.into()) };
        Some(SessionTitle { title: cut_title(title), message_seqs, source })
    }
}

/// `text` cut to `MAX_TITLE_CHARS` characters, `…` marking a cut.
fn cut_title(text: &str) -> String {
    cut_chars(text, MAX_TITLE_CHARS)
}

/// `text` cut to `max` characters (at least 1), `…` marking a cut (as the last of them).
pub(crate) fn cut_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max.max(1) - 1) {
        Some((cut, _)) if text.chars().nth(max).is_some() => format!("{}…", &text[..cut]),
        _ => text.to_string(),
    }
}

macro_rules! event_kinds {
    ($($(#[$meta:meta])* $variant:ident($payload:ty) = $name:literal;)*) => {
        /// The type of an event: one of the kinds kin writes or reads, or another one by name.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum Kind {
            $($(#[$meta])* $variant,)*
            /// A type kin does not know (dsh's plugin events such as `hook/invoked`), kept by name.
            Other(Box<str>),
        }

        impl Kind {
            /// The wire name (the envelope's `type`).
            pub fn as_str(&self) -> &str {
                match self {
                    $(Kind::$variant => $name,)*
                    Kind::Other(name) => name,
                }
            }

            /// The kind a wire name stands for.
            pub fn parse(name: &str) -> Kind {
                match name {
                    $($name => Kind::$variant,)*
                    other => Kind::Other(other.into()),
                }
            }
        }

        /// The body of an event: its kind and typed payload.
        #[derive(Debug, Clone, PartialEq)]
        pub enum EventBody {
            $($(#[$meta])* $variant($payload),)*
            /// A kind kin does not know, or a payload that does not fit its kind: kept as it is.
            Unknown { kind: String, data: Value },
        }

        impl EventBody {
            pub fn kind(&self) -> Kind {
                match self {
                    $(EventBody::$variant(_) => Kind::$variant,)*
                    EventBody::Unknown { kind, .. } => Kind::parse(kind),
                }
            }

            /// The envelope's `type` and `data`.
            pub(super) fn into_parts(self) -> (Kind, Data) {
                match self {
                    $(EventBody::$variant(payload) => (Kind::$variant, Data::of_payload(&payload)),)*
                    EventBody::Unknown { kind, data } => (Kind::parse(&kind), Data::of(&data)),
                }
            }

            fn read(kind: &Kind, data: &Data) -> EventBody {
                let typed = match kind {
                    $(Kind::$variant => data.read::<$payload>().ok().map(EventBody::$variant),)*
                    Kind::Other(_) => None,
                };
                typed.unwrap_or_else(|| EventBody::Unknown { kind: kind.as_str().to_string(), data: data.to_value() })
            }
        }

        $(
            impl Payload for $payload {
                const KIND: Kind = Kind::$variant;
            }

            impl From<$payload> for EventBody {
                fn from(payload: $payload) -> Self {
                    EventBody::$variant(payload)
                }
            }
        )*
    };
}

event_kinds! {
    TurnStart(TurnStart) = "turn/start";
    UserMessage(UserMessage) = "user/message";
    SteeringMessage(SteeringMessage) = "steering/message";
    StepStart(StepStart) = "step/start";
    AssistantChunk(AssistantChunk) = "assistant/chunk";
    AssistantMessage(AssistantMessage) = "assistant/message";
    ToolCall(ToolCall) = "tool/call";
    ToolProgress(ToolProgress) = "tool/progress";
    ToolResult(ToolResult) = "tool/result";
    StepEnd(StepEnd) = "step/end";
    TurnEnd(TurnEnd) = "turn/end";
    LlmRetry(LlmRetry) = "llm/retry";
    SystemPrompt(SystemPrompt) = "system/prompt";
    TodoWrite(TodoWrite) = "todo/write";
    SessionMode(SessionMode) = "session/mode";
    SessionModel(SessionModel) = "session/model";
    SessionSandbox(SandboxChoice) = "session/sandbox";
    McpServers(McpServers) = "mcp/servers";
    SessionEndSeed(EndSeed) = "session/end-seed";
    SubagentDescriptor(DescriptorPayload) = "subagent/descriptor";
    SubagentRemoteRun(RemoteRun) = "subagent/remote-run";
    AgentInboxSpliced(InboxSplice) = "agent/inbox/spliced";
    CompactStart(CompactStart) = "compact/start";
    CompactSummary(CompactSummary) = "compact/summary";
    CompactEnd(CompactEnd) = "compact/end";
    SessionTitle(SessionTitle) = "session/title";
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The wire `data` of a typed body, as one line.
    fn wire(body: impl Into<EventBody>) -> String {
        serde_json::to_string(&body.into().into_parts().1).unwrap()
    }

    #[test]
    fn every_kind_round_trips_its_name() {
        for name in [
            "turn/start",
            "user/message",
            "steering/message",
            "step/start",
            "assistant/chunk",
            "assistant/message",
            "tool/call",
            "tool/progress",
            "tool/result",
            "step/end",
            "turn/end",
            "llm/retry",
            "system/prompt",
            "todo/write",
            "session/mode",
            "session/model",
            "session/sandbox",
            "mcp/servers",
            "session/end-seed",
            "subagent/descriptor",
            "subagent/remote-run",
            "agent/inbox/spliced",
            "compact/start",
            "compact/summary",
            "compact/end",
            "session/title",
        ] {
            let kind = Kind::parse(name);
            assert!(!matches!(kind, Kind::Other(_)), "{name} is a known kind");
            assert_eq!(kind.as_str(), name);
        }
        assert_eq!(Kind::parse("hook/invoked"), Kind::Other("hook/invoked".into()));
        assert_eq!(Kind::parse("hook/invoked").as_str(), "hook/invoked");
    }

    #[test]
    fn a_fallback_title_is_the_first_five_words_as_dsh_writes_it() {
        let user = |text: &str| UserMessage::new(vec![json!({"type": "text", "text": text})], json!({"kind": "user"}));
        // The prompts and titles of dsh's recorded fixtures (../shared/conformance/dsh).
        for (prompt, title) in [
            ("Start a long task; this turn will be cancelled mid-stream.", "Start a long task; this"),
            ("Use the read tool (NOT bash) to read the file greeting.txt", "Use the read tool (NOT"),
            ("Reply with exactly the word: PONG. Do not use any tools.", "Reply with exactly the word:"),
            ("  Two\nwords ", "Two words"),
        ] {
            let shown = SessionTitle::fallback(&user(prompt), 1).unwrap();
            assert_eq!(shown.title, title);
        }
        assert_eq!(
            wire(SessionTitle::fallback(&user("Say hi."), 1).unwrap()),
            r#"{"title":"Say hi.","messageSeqs":[1],"source":{"kind":"fallback"}}"#
        );
        assert_eq!(SessionTitle::fallback(&user(" \n "), 1), None);
        let long = SessionTitle::fallback(&user(&"x".repeat(300)), 1).unwrap().title;
        assert_eq!(long.chars().count(), MAX_TITLE_CHARS);
        assert!(long.ends_with('…'));
        let named = SessionTitle::by_model(" \"Fix the parser\"\n", vec![1, 9], "p", "m").unwrap();
        assert_eq!(
            wire(named),
            r#"{"title":"Fix the parser","messageSeqs":[1,9],"source":{"kind":"model","provider":"p","model":"m"}}"#
        );
        assert_eq!(SessionTitle::by_model("\"\"", vec![], "p", "m"), None);
        // An escape sequence in a prompt (or a title model's answer) leaves no control character
        // in the title: it would retitle or recolour the terminal that lists it.
        let hostile = "hello\u{7}\u{1b}]0;PWNED\u{7}\u{1b}[31mred";
        assert_eq!(SessionTitle::fallback(&user(hostile), 1).unwrap().title, "hello ]0;PWNED [31mred");
        assert_eq!(SessionTitle::by_model(hostile, vec![1], "p", "m").unwrap().title, "hello ]0;PWNED [31mred");
        // What is attached (a file's text, perhaps a secret) is not the user's words.
        let attached = "\n[resource uri=\"file:///w/.env\"]\nAPI_KEY=sk-live-123 hello\n[/resource]\nwhat is this";
        assert_eq!(SessionTitle::fallback(&user(attached), 1).unwrap().title, "what is this");
        let linked = "Review\n[resource_link name=\"a.rs\" uri=\"file:///w/a.rs\"]\nand\n[resource uri=\"file:///w/b.bin\" mimeType=\"application/octet-stream\": about 3 bytes of binary data, not shown]\nb please";
        assert_eq!(SessionTitle::fallback(&user(linked), 1).unwrap().title, "Review and b please");
        let only_a_file = "\n[resource uri=\"file:///w/.env\"]\nAPI_KEY=sk-live-123\n[/resource]\n";
        assert_eq!(SessionTitle::fallback(&user(only_a_file), 1), None);
    }

    #[test]
    fn payloads_serialize_in_the_order_kin_writes() {
        let user = json!({"kind": "user"});
        assert_eq!(
            wire(TurnStart { turn: 1, trigger: Trigger::message(user.clone()) }),
            r#"{"turn":1,"trigger":{"kind":"message","source":{"kind":"user"}}}"#
        );
        assert_eq!(wire(TurnStart { turn: 2, trigger: Trigger::retry() }), r#"{"turn":2,"trigger":{"kind":"retry"}}"#);
        assert_eq!(wire(CompactStart { turn: None }), r#"{"turn":null}"#);
        assert_eq!(wire(CompactEnd { turn: Some(3), error: None }), r#"{"turn":3}"#);
        assert_eq!(wire(CompactEnd { turn: None, error: Some("boom".into()) }), r#"{"turn":null,"error":"boom"}"#);
        let summary = CompactSummary {
            summary: vec![json!({"type": "text", "text": "s"})],
            raw_output: None,
            shadowed_range: SeqRange { start: 1, end: 7 },
            shadowed_seqs: vec![1, 4, 7],
            shadowed_token_count: 90,
            provider: "p".into(),
            model: "m".into(),
            max_tokens: Some(8192),
            usage: Some(json!({"inputTokens": 5})),
        };
        assert_eq!(
            wire(summary),
            r#"{"summary":[{"type":"text","text":"s"}],"shadowedRange":{"start":1,"end":7},"shadowedSeqs":[1,4,7],"shadowedTokenCount":90,"provider":"p","model":"m","maxTokens":8192,"usage":{"inputTokens":5}}"#
        );
        let text = json!({"type": "text", "text": "hi"});
        let message = UserMessage { id: "m".into(), ..UserMessage::new(vec![text.clone()], user) };
        assert_eq!(
            wire(message),
            r#"{"content":[{"type":"text","text":"hi"}],"source":{"kind":"user"},"role":"user","id":"m"}"#
        );
        assert_eq!(wire(StepStart { turn: 1, step: 2 }), r#"{"turn":1,"step":2}"#);
        let chunk = StreamChunk::TextDelta { index: 0, text: "Hi".into() };
        assert_eq!(
            wire(AssistantChunk { turn: 1, step: 1, chunk }),
            r#"{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"Hi"}}"#
        );
        let reply = ModelMessage { id: "a".into(), ..ModelMessage::new(vec![text], "p", "m") };
        let usage = Some(json!({"inputTokens": 1}));
        assert_eq!(
            wire(AssistantMessage { turn: 1, step: 1, message: reply.clone(), usage }),
            r#"{"turn":1,"step":1,"message":{"role":"assistant","content":[{"type":"text","text":"hi"}],"source":{"kind":"model","provider":"p","model":"m"},"id":"a"},"usage":{"inputTokens":1}}"#
        );
        assert!(!wire(AssistantMessage { turn: 1, step: 1, message: reply, usage: None }).contains("usage"));
        let call = ToolCall { turn: 1, step: 1, call_id: "c".into(), name: "read".into(), arguments: "{}".into() };
        assert_eq!(wire(call), r#"{"turn":1,"step":1,"callId":"c","name":"read","arguments":"{}"}"#);
        let progress = ToolProgress { turn: 1, step: 1, call_id: "c".into(), text: "Read a".into() };
        assert_eq!(wire(progress), r#"{"turn":1,"step":1,"callId":"c","text":"Read a"}"#);
        assert_eq!(
            wire(TurnEnd { turn: 3, reason: TurnEndReason::MaxTokens }),
            r#"{"turn":3,"reason":{"kind":"max-tokens"}}"#
        );
        let failure = Some(Failure::new("boom", "X"));
        assert_eq!(
            wire(TurnEnd { turn: 1, reason: TurnEndReason::Error { step: 2, failure } }),
            r#"{"turn":1,"reason":{"kind":"error","step":2,"failure":{"message":"boom","code":"X"}}}"#
        );
        let retry = LlmRetry {
            turn: Some(1),
            step: 1,
            attempt: 2,
            max_attempts: 3,
            delay_ms: 10,
            code: "TIMEOUT".into(),
            reason: "slow".into(),
            requested_delay_ms: None,
        };
        assert_eq!(
            wire(retry),
            r#"{"turn":1,"step":1,"attempt":2,"maxAttempts":3,"delayMs":10,"code":"TIMEOUT","reason":"slow"}"#
        );
        let plan = TodoWrite { todos: vec![Todo { content: "a".into(), status: "pending".into() }] };
        assert_eq!(wire(plan), r#"{"todos":[{"content":"a","status":"pending"}]}"#);
        assert_eq!(wire(SessionMode { mode: "ask".into() }), r#"{"mode":"ask"}"#);
        assert_eq!(wire(SessionModel { provider: "p".into(), model: "m".into() }), r#"{"provider":"p","model":"m"}"#);
        let sandbox = SandboxChoice { level: "workspace-write".into(), network: false };
        assert_eq!(wire(sandbox), r#"{"level":"workspace-write","network":false}"#);
        assert_eq!(wire(EndSeed {}), "{}");
        let run = RemoteRun {
            run_id: "acp-1".into(),
            provider: "acp:x".into(),
            command: "sh".into(),
            child_session_id: "s".into(),
            output: "o".into(),
            stop_reason: "error".into(),
            error: Some("e".into()),
        };
        assert_eq!(
            wire(run),
            r#"{"runId":"acp-1","provider":"acp:x","command":"sh","childSessionId":"s","output":"o","stopReason":"error","error":"e"}"#
        );
    }

    #[test]
    fn a_tool_result_is_a_dsh_tool_result_message() {
        let content = vec![json!({"type": "text", "text": "Error: no"})];
        let failure = ToolFailure { name: "ToolError".into(), code: "X".into() };
        let mut result = ToolResult::new(1, 2, "c1", content, Some(failure), None);
        result.message.id = "r".into();
        assert_eq!(
            wire(result.clone()),
            r#"{"turn":1,"step":2,"message":{"source":{"kind":"tool","callId":"c1"},"content":[{"type":"tool-result","toolCallId":"c1","content":[{"type":"text","text":"Error: no"}],"isError":true}],"role":"user","id":"r"},"error":{"name":"ToolError","code":"X"}}"#
        );
        assert_eq!(result.call_id(), Some("c1"));
        let ok = ToolResult::new(1, 1, "c2", Vec::new(), None, Some(json!({"diff": {}})));
        let line = wire(ok);
        assert!(line.contains(r#""isError":false"#) && line.ends_with(r#""meta":{"diff":{}}}"#), "{line}");
    }

    #[test]
    fn an_event_keeps_its_data_and_reads_leniently() {
        let data = json!({"turn": 4, "reason": {"kind": "completed"}, "extra": [1]});
        let event = Event {
            kind: Kind::TurnEnd,
            seq: 0,
            time: 0,
            data: data.clone().into(),
            source_event_seqs: None,
            surface_op: None,
        };
        assert_eq!(event.get::<TurnEnd>(), Some(TurnEnd { turn: 4, reason: TurnEndReason::Completed }));
        assert_eq!(event.body(), EventBody::TurnEnd(TurnEnd { turn: 4, reason: TurnEndReason::Completed }));
        assert_eq!(event.get::<TurnStart>(), None, "another kind");
        // A reason kin does not know, and dsh's older error shape, still read as turn ends.
        let odd = Event { data: json!({"turn": 1, "reason": {"kind": "later", "why": 1}}).into(), ..event.clone() };
        assert_eq!(odd.get::<TurnEnd>().map(|t| t.reason), Some(TurnEndReason::Unrecognized));
        let dsh = Event {
            data: json!({"turn": 1, "reason": {"kind": "error", "message": "m", "code": "C"}}).into(),
            ..event.clone()
        };
        assert_eq!(dsh.get::<TurnEnd>().map(|t| t.reason), Some(TurnEndReason::Error { step: 0, failure: None }));
        // A payload whose needed fields do not fit is not understood, and kept as it is.
        let bad = Event { kind: Kind::ToolCall, data: json!({"callId": 7}).into(), ..event };
        assert_eq!(bad.body(), EventBody::Unknown { kind: "tool/call".into(), data: json!({"callId": 7}) });
        let unknown = Event { kind: Kind::parse("hook/invoked"), data: json!({"title": "t"}).into(), ..bad };
        assert_eq!(unknown.body(), EventBody::Unknown { kind: "hook/invoked".into(), data: json!({"title": "t"}) });
        assert_eq!(Event::new(0, 0, unknown.body(), None), unknown, "an unknown body writes back what it read");
    }

    #[test]
    fn surface_kinds_are_appended_to_the_history() {
        let message = UserMessage::new(Vec::new(), json!({"kind": "user"}));
        let event = Event::new(3, 9, message, None);
        assert_eq!(event.surface_op, Some(json!("append")));
        assert_eq!(event.surface_message(), Some(event.data.to_value()));
        let step = Event::new(4, 9, StepEnd { turn: 1, step: 1 }, None);
        assert_eq!((&step.surface_op, step.surface_message()), (&None, None));
    }
}
