//! In-process providers: `spawn` (a fresh conversation) and `fork` (seeded with the parent's
//! completed turns). Both publish an ordinary child session through a `ChildFactory` before
//! `start` returns, append the descriptor inside the child's first turn before its first model
//! request, and map the child's turn end to a stop reason.

use std::sync::{Arc, Mutex, Weak};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::descriptor::ToolFilter;
use super::{
    Capabilities, ErrorCode, NamedAgent, ResolvedStart, StopReason, SubagentError, SubagentProvider, SubagentResult,
    SubagentRun, child_title,
};
use crate::agent::{AgentHandle, Restored, TurnEnd};
use crate::model::ModelRoute;
use crate::session::event;
use crate::session::{Event, Kind, Session, SessionHeader, SessionObserver, now_ms};
use crate::tools::{Access, Progress, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};

/// How a child agent is composed on top of the runtime's base.
pub struct ChildSetup {
    pub route: ModelRoute,
    pub persona: Option<String>,
    pub tool_filter: Option<ToolFilter>,
    /// Tools only this child has (`structured_output`, `report`), surviving the filter.
    pub extra_tools: Vec<Arc<dyn Tool>>,
    /// How an editor watching the parent shows the child.
    pub display: ChildDisplay,
    /// The delegating call's progress (a foreground child): each tool call the child makes is
    /// reported there.
    pub progress: Option<Progress>,
    /// The named agent it runs as: its permission cap and turn limit apply.
    pub agent: Option<NamedAgent>,
}

/// Reports each tool call of a child session (by its title among the child's `tools`) as
/// progress on the parent's delegating call.
pub(crate) struct ReportToolCalls {
    pub progress: Progress,
    pub tools: ToolRegistry,
}

impl SessionObserver for ReportToolCalls {
    fn on_event(&self, _: &SessionHeader, event: &Event) {
        if let Some(call) = event.get::<event::ToolCall>() {
            let args: Value = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
            self.progress.report(self.tools.shown(&call.name, &args).0);
        }
    }
}

/// How a child is shown to an editor watching its parent: a title (the delegation's label), a
/// description (the start of its task) and the parent's tool call that started it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChildDisplay {
    pub title: Option<String>,
    pub description: Option<String>,
    pub call_id: Option<String>,
}

/// The longest description shown for a child, in characters.
const DESCRIPTION_CHARS: usize = 200;

/// A short description of a task: the text of its content blocks, trimmed and cut to
/// `DESCRIPTION_CHARS` characters (`…` marks a cut); `None` when there is no text.
pub(crate) fn describe<'a>(blocks: impl IntoIterator<Item = &'a Value>) -> Option<String> {
    let text: String = blocks.into_iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join(" ");
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut cut: String = text.chars().take(DESCRIPTION_CHARS).collect();
    if text.chars().count() > DESCRIPTION_CHARS {
        cut.push('…');
    }
    Some(cut)
}

/// Everything needed to create a child agent.
pub struct ChildSpec {
    pub header: SessionHeader,
    /// Lineage seed (fork): written verbatim before the child's own events.
    pub seed: Vec<Event>,
    pub setup: ChildSetup,
}

/// Creates, resumes and tracks child agents (implemented by the runtime).
pub trait ChildFactory: Send + Sync {
    /// A fresh session id.
    fn mint_id(&self) -> String;
    /// Creates a child session durably (seed, then `session/end-seed` when seeded).
    fn create_session(&self, header: SessionHeader, seed: Vec<Event>) -> Result<Session, SubagentError>;
    /// The repairing load of a stored session (cold resume), with its inbox read back
    /// (`agent::prepare`).
    fn load_session(&self, id: &str) -> Result<(Session, Restored), String>;
    /// The header of a stored session, read without loading (or repairing) it.
    fn stored_header(&self, id: &str) -> Option<SessionHeader>;
    /// The events of a stored session, read without repairing it.
    fn stored_events(&self, id: &str) -> Result<Vec<Event>, String>;
    /// The headers of every stored subagent session (one with a `parentSession` and origin
    /// `subagent`), from one listing of the store, in no particular order.
    fn stored_subagents(&self) -> Vec<SessionHeader>;
    /// Starts an agent on a child session and registers it as live; `restored` are the inbox
    /// messages its log holds (they run once it is woken).
    fn start_agent(&self, session: Session, restored: Restored, setup: ChildSetup) -> AgentHandle;
    /// The live agent of a session, top-level or child.
    fn live_agent(&self, id: &str) -> Option<AgentHandle>;
    /// The sessions above a live agent, nearest first, through live agents (the runtime's one
    /// registry of the live tree).
    fn live_ancestors(&self, id: &str) -> Vec<String>;
    /// Forgets a child agent that was shut down.
    fn release(&self, id: &str);
    /// The named agent `name` as the live top-level session at or above `session_id` defines it
    /// now, resolved as a new child of it would be; `None` when it defines no such agent.
    fn agent_now(&self, session_id: &str, name: &str) -> Option<super::agents::Launch>;
    /// Rolls back a child that was created but never accepted work: its agent (when one was
    /// started) is disposed and released, and its log removed, so nothing of it is listable or
    /// resumable. Failures are logged: the caller is already failing.
    fn roll_back<'a>(&'a self, id: &'a str, handle: Option<AgentHandle>) -> BoxFuture<'a, ()>;
    /// `create_session` then `start_agent`.
    fn create_child(&self, spec: ChildSpec) -> Result<AgentHandle, SubagentError> {
        let session = self.create_session(spec.header, spec.seed)?;
        Ok(self.start_agent(session, Restored::none(), spec.setup))
    }
}

/// The `spawn` or `fork` provider.
pub struct InProcessProvider {
    name: String,
    fork: bool,
    factory: Weak<dyn ChildFactory>,
}

impl InProcessProvider {
    pub fn spawn(factory: Weak<dyn ChildFactory>) -> Self {
        InProcessProvider { name: "spawn".into(), fork: false, factory }
    }

    pub fn fork(factory: Weak<dyn ChildFactory>) -> Self {
        InProcessProvider { name: "fork".into(), fork: true, factory }
    }
}

/// The header of a child of `parent`.
pub(crate) fn child_header(id: String, parent: &SessionHeader, depth: u64, seed_length: usize) -> SessionHeader {
    let mut header = SessionHeader::new(id, now_ms(), parent.cwd.clone());
    header.parent_session = Some(parent.id.clone());
    header.seed_length = (seed_length > 0).then_some(seed_length as u64);
    header.origin = Some("subagent".into());
    header.delegation_depth = depth;
    header
}

impl SubagentProvider for InProcessProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    fn inherits_parent_context(&self) -> bool {
        self.fork
    }

    fn prepare_continuable(&self, parent: &crate::tools::Caller) -> Option<Vec<Event>> {
        if self.fork { Some(parent.history.as_ref().map(|h| h.to_vec()).unwrap_or_default()) } else { Some(Vec::new()) }
    }

    fn start(&self, resolved: ResolvedStart) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        let factory = self.factory.upgrade();
        let fork = self.fork;
        async move {
            let factory =
                factory.ok_or_else(|| SubagentError::new(ErrorCode::Infrastructure, "the runtime is shutting down"))?;
            let ResolvedStart { request, descriptor, child_depth } = resolved;
            let seed =
                if fork { request.parent.history.as_ref().map(|h| h.to_vec()).unwrap_or_default() } else { Vec::new() };
            let header = child_header(factory.mint_id(), &request.parent.header, child_depth, seed.len());
            let id = header.id.clone();
            let cwd = header.cwd.clone();
            let capture = Arc::new(Mutex::new(None));
            let mut extra_tools: Vec<Arc<dyn Tool>> = Vec::new();
            if let Some(schema) = &request.output_schema {
                extra_tools.push(Arc::new(StructuredOutput { schema: schema.clone(), slot: capture.clone() }));
            }
            let display = ChildDisplay {
                title: child_title(request.agent.as_ref().map(|a| a.name.as_str()), request.label.as_deref()),
                description: describe(&request.prompt),
                call_id: request.call_id.clone(),
            };
            let setup = ChildSetup {
                route: request.route.clone().unwrap_or_else(|| request.parent.route.clone()),
                persona: request.persona.clone(),
                tool_filter: request.tool_filter.clone(),
                extra_tools,
                display,
                progress: request.progress.clone(),
                agent: request.agent.clone(),
            };
            let handle = factory.create_child(ChildSpec { header, seed, setup })?;
            let turn =
                match handle.followup_with(request.prompt.clone(), json!({"kind": "user"}), vec![descriptor.event()]) {
                    Ok(turn) => turn,
                    Err(e) => {
                        // Not published to the caller: nothing of the child may stay behind.
                        factory.roll_back(&id, Some(handle)).await;
                        return Err(SubagentError::new(ErrorCode::Infrastructure, e.to_string()));
                    }
                };
            let (tx, result) = oneshot::channel();
            let runner = handle.clone();
            let wants_capture = request.output_schema.is_some();
            tokio::spawn(async move {
                let _ = tx.send(drive(runner, turn, request.cancel, capture, wants_capture).await);
            });
            let disposer = handle.clone();
            let releaser = factory.clone();
            Ok(SubagentRun {
                id,
                local: true,
                cwd,
                result,
                dispose: Box::new(move || {
                    async move {
                        let disposed = disposer.dispose().await;
                        releaser.release(disposer.id());
                        disposed
                    }
                    .boxed()
                }),
            })
        }
        .boxed()
    }
}

/// Waits for the child's turn (cancelling it if the caller cancels) and builds the result.
async fn drive(
    child: AgentHandle,
    turn: oneshot::Receiver<TurnEnd>,
    cancel: tokio_util::sync::CancellationToken,
    capture: Arc<Mutex<Option<Value>>>,
    wants_capture: bool,
) -> Result<SubagentResult, SubagentError> {
    tokio::pin!(turn);
    let end = tokio::select! {
        end = &mut turn => end,
        () = cancel.cancelled() => {
            child.cancel();
            turn.await
        }
    }
    .map_err(|_| SubagentError::new(ErrorCode::Infrastructure, "the child agent stopped before its turn ended"))?;
    // A child shut down with its turn (its parent's session closed) has no answer to read: the
    // run ends as what stopped it, not as a fault.
    let output = match child.read(|s| last_assistant_text(s.events(), first_live_seq(s.events()))).await {
        Ok(output) => output,
        Err(_) if cancel.is_cancelled() || matches!(end, TurnEnd::Disposed) => String::new(),
        Err(e) => return Err(SubagentError::new(ErrorCode::Infrastructure, e.to_string())),
    };
    let structured = capture.lock().ok().and_then(|c| c.clone());
    let (mut stop_reason, mut failure) = match end {
        TurnEnd::Completed => (StopReason::Completed, None),
        TurnEnd::MaxTokens => (StopReason::MaxTokens, None),
        TurnEnd::Aborted => (StopReason::Aborted, None),
        TurnEnd::Disposed => (StopReason::Error, Some("the child agent was shut down during its turn".to_string())),
        TurnEnd::StepLimit(cause) | TurnEnd::Error(cause) => (StopReason::Error, Some(cause)),
    };
    if cancel.is_cancelled() && stop_reason != StopReason::Completed {
        (stop_reason, failure) = (StopReason::Aborted, None);
    }
    if wants_capture && structured.is_none() && stop_reason == StopReason::Completed {
        stop_reason = StopReason::Error;
        failure = Some("the child finished without calling structured_output".to_string());
    }
    Ok(SubagentResult { output, structured, stop_reason, failure, remote: None })
}

/// The seq after a lineage seed (`session/end-seed`), or 0.
fn first_live_seq(events: &[Event]) -> u64 {
    events.iter().find(|e| e.kind == Kind::SessionEndSeed).map_or(0, |e| e.seq + 1)
}

/// The text of the last assistant message at or after `from`, as its parent gets it: bounded
/// by `OUTPUT_LIMITS` (a child's answer is the parent's tool result or closing message).
pub(crate) fn last_assistant_text(events: &[Event], from: u64) -> String {
    let text: String = events
        .iter()
        .rev()
        .take_while(|e| e.seq >= from)
        .find(|e| e.kind == Kind::AssistantMessage)
        .and_then(Event::get::<event::AssistantMessage>)
        .map(|m| m.message.content.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect())
        .unwrap_or_default();
    crate::tools::capture::ends_of(&text, super::OUTPUT_LIMITS)
}

/// `structured_output`: the child's capture tool for a requested schema.
struct StructuredOutput {
    schema: Value,
    slot: Arc<Mutex<Option<Value>>>,
}

impl Tool for StructuredOutput {
    fn name(&self) -> &str {
        "structured_output"
    }

    fn access(&self, _arguments: &Value) -> Access {
        Access::Delegate
    }

    fn description(&self) -> String {
        "Deliver your final answer as structured data matching the parameter schema. Call this exactly once, when your work is done; your task is not complete until it succeeds.".into()
    }

    fn parameters(&self) -> Value {
        self.schema.clone()
    }

    fn execute(&self, arguments: Value, _ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let (schema, slot) = (self.schema.clone(), self.slot.clone());
        async move {
            check_shape(&schema, &arguments).map_err(|e| ToolError::new("INVALID_STRUCTURED_OUTPUT", e))?;
            if let Ok(mut slot) = slot.lock() {
                *slot = Some(arguments);
            }
            Ok(ToolOutput::text("structured output captured"))
        }
        .boxed()
    }
}

/// A small structural check: an object with every `required` key and the declared primitive
/// types of known properties.
fn check_shape(schema: &Value, value: &Value) -> Result<(), String> {
    let object = value.as_object().ok_or("the structured output must be a JSON object")?;
    for key in schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        if !object.contains_key(key) {
            return Err(format!("the structured output lacks the required field {key:?}"));
        }
    }
    for (key, spec) in schema["properties"].as_object().into_iter().flatten() {
        let Some(v) = object.get(key) else { continue };
        let ok = match spec["type"].as_str() {
            Some("string") => v.is_string(),
            Some("number") => v.is_number(),
            Some("integer") => v.is_i64() || v.is_u64(),
            Some("boolean") => v.is_boolean(),
            Some("array") => v.is_array(),
            Some("object") => v.is_object(),
            _ => true,
        };
        if !ok {
            return Err(format!("field {key:?} must be of type {}", spec["type"]));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_answer_reaches_its_parent_bounded() {
        let answer = |seq, text: &str| {
            Event {
            kind: Kind::AssistantMessage.as_str().into(),
            seq,
            time: 0,
            data: serde_json::json!({"turn": 1, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": text}]}}).into(),
            source_event_seqs: None,
            surface_op: None,
        }
        };
        let short = [answer(0, "old"), answer(1, "done")];
        assert_eq!(last_assistant_text(&short, 0), "done");
        assert_eq!(last_assistant_text(&short, 2), "", "nothing at or after the seq");
        let long = format!("{}{}", "h".repeat(100_000), "t".repeat(100_000));
        let got = last_assistant_text(&[answer(0, &long)], 0);
        assert!(got.len() < 80_100, "{} bytes", got.len());
        assert!(got.starts_with(&"h".repeat(40_000)) && got.ends_with(&"t".repeat(40_000)));
        assert!(got.contains("[... 120000 bytes omitted ...]"), "the cut says so");
    }
}
