//! One turn: `turn/start`, the user message, then steps (one model call plus the tool calls it
//! asked for) until the model stops without tool calls, the step limit, cancellation, or failure;
//! then `turn/end`. Everything is appended to the session as it happens.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{AgentDeps, Staged, TurnEnd};
use crate::model::{Failure, FinishReason, ModelRequest, StreamChunk};
use crate::permission::admit;
use crate::session::Session;
use crate::tools::{Caller, Progress, ToolContext, ToolError, ToolOutput, ToolRegistry};

/// The balanced prefix of a log: every event through the last `turn/end` (empty if none), so
/// it never ends inside an open turn or on a dangling tool call.
pub fn completed_prefix(events: &[crate::session::Event]) -> &[crate::session::Event] {
    let end = events.iter().rposition(|e| e.kind == crate::session::Kind::TurnEnd).map_or(0, |i| i + 1);
    &events[..end]
}

/// How one step ended.
enum StepEnd {
    /// The model answered without tool calls.
    Done,
    /// Tools ran; the model needs another step.
    Continue,
    /// The turn is over with this reason (already written to the log by the step).
    Over(TurnEnd),
}

/// What starts a turn.
pub(super) struct TurnInput {
    /// The turn's user message (`{content, source, role, id}`).
    pub message: Value,
    pub preamble: Vec<(String, Value)>,
}

pub(super) async fn run_turn(
    session: &mut Session,
    deps: &AgentDeps,
    input: TurnInput,
    cancel: CancellationToken,
    staged: &Staged,
    disposing: &AtomicBool,
) -> TurnEnd {
    let cancelled = || cancelled_end(disposing);
    let TurnInput { message, preamble } = input;
    let turn = session.next_turn();
    session.append(
        "turn/start",
        json!({"turn": turn, "trigger": {"kind": "message", "source": message["source"].clone()}}),
    );
    session.append_surface("user/message", message, None);
    for (kind, data) in preamble {
        session.append(&kind, data);
    }
    // The prompt is on disk before the model runs: a crash leaves a turn to repair, not nothing.
    session.write_eager();
    for step in 1..=u64::from(deps.max_steps) {
        let staged_now: Vec<_> = staged.lock().map(|mut s| s.drain(..).collect()).unwrap_or_default();
        for message in staged_now {
            session.append_surface("user/message", message, None);
        }
        session.append("step/start", json!({"turn": turn, "step": step}));
        let end = run_step(session, deps, turn, step, &cancel, disposing).await;
        match end {
            StepEnd::Done => {
                session.append("step/end", json!({"turn": turn, "step": step}));
                return end_turn(session, turn, TurnEnd::Completed, json!({"kind": "completed"}));
            }
            StepEnd::Continue => {
                session.append("step/end", json!({"turn": turn, "step": step}));
                if cancel.is_cancelled() {
                    let (end, reason) = cancelled();
                    return end_turn(session, turn, end, reason);
                }
            }
            StepEnd::Over(end) => return end,
        }
    }
    let failure = Failure::new(
        format!(
            "the model used all {} steps of this turn without a final answer (raise agent.max_steps to allow more)",
            deps.max_steps
        ),
        "STEP_LIMIT",
    );
    let step = deps.max_steps;
    end_turn(
        session,
        turn,
        TurnEnd::Error(failure.message.clone()),
        json!({"kind": "error", "step": step, "failure": failure}),
    )
}

/// How a cancelled turn ends: `disposed` when the agent is shutting down, else `aborted`.
fn cancelled_end(disposing: &AtomicBool) -> (TurnEnd, Value) {
    if disposing.load(Ordering::SeqCst) {
        (TurnEnd::Disposed, json!({"kind": "disposed"}))
    } else {
        (TurnEnd::Aborted, json!({"kind": "aborted"}))
    }
}

fn end_turn(session: &mut Session, turn: u64, end: TurnEnd, reason: Value) -> TurnEnd {
    session.append("turn/end", json!({"turn": turn, "reason": reason}));
    end
}

/// Ends the open step and the turn.
fn abandon(session: &mut Session, turn: u64, step: u64, end: TurnEnd, reason: Value) -> StepEnd {
    session.append("step/end", json!({"turn": turn, "step": step}));
    StepEnd::Over(end_turn(session, turn, end, reason))
}

async fn run_step(
    session: &mut Session,
    deps: &AgentDeps,
    turn: u64,
    step: u64,
    cancel: &CancellationToken,
    disposing: &AtomicBool,
) -> StepEnd {
    // The tools of this step: a source's (MCP) changes show from the next step on.
    let tools = deps.tools.snapshot(cancel).await;
    let request = ModelRequest {
        session_id: session.id().to_string(),
        turn,
        step,
        cwd: session.header.cwd.as_ref().map(Into::into),
        route: deps.route.clone(),
        system: deps.system.clone(),
        messages: session.messages(),
        tools: tools.schemas(),
    };
    let mut stream = deps.model.stream(request, cancel.child_token());
    let mut chunk_seqs = Vec::new();
    let mut blocks: BTreeMap<u64, Value> = BTreeMap::new();
    let mut usage = None;
    let outcome: Result<FinishReason, Failure> = loop {
        session.write_eager();
        let item = tokio::select! {
            biased;
            () = cancel.cancelled() => break Ok(FinishReason::Aborted { failure: None }),
            item = stream.recv() => item,
        };
        for retry in deps.model.take_retries(session.id()) {
            session.append("llm/retry", retry);
        }
        match item {
            Some(Ok(chunk)) => {
                let value = serde_json::to_value(&chunk).unwrap_or(Value::Null);
                chunk_seqs.push(session.append("assistant/chunk", json!({"turn": turn, "step": step, "chunk": value})));
                match chunk {
                    StreamChunk::BlockEnd { index, block } => {
                        blocks.insert(index, block);
                    }
                    StreamChunk::Usage { usage: u } => usage = Some(u),
                    StreamChunk::Finish { reason, .. } => break Ok(reason),
                    _ => {}
                }
            }
            Some(Err(failure)) => break Err(failure),
            None => {
                break Err(Failure::new("the model stream ended without a finish", "STREAM_INCOMPLETE"));
            }
        }
    };
    let finish = match outcome {
        Ok(FinishReason::Aborted { .. }) => {
            let (end, reason) = cancelled_end(disposing);
            return abandon(session, turn, step, end, reason);
        }
        Ok(FinishReason::Error { failure }) | Err(failure) => {
            let end = TurnEnd::Error(failure.message.clone());
            return abandon(session, turn, step, end, json!({"kind": "error", "step": step, "failure": failure}));
        }
        Ok(finish) => finish,
    };
    let content: Vec<Value> = blocks.into_values().collect();
    let mut data = json!({
        "turn": turn,
        "step": step,
        "message": {
            "role": "assistant",
            "content": content,
            "source": {"kind": "model", "provider": deps.route.provider, "model": deps.route.model},
            "id": uuid::Uuid::new_v4().to_string(),
        },
    });
    if let Some(usage) = usage {
        data["usage"] = usage;
    }
    session.append_surface("assistant/message", data, Some(chunk_seqs));
    if finish == FinishReason::MaxTokens {
        return abandon(session, turn, step, TurnEnd::MaxTokens, json!({"kind": "max-tokens"}));
    }
    let calls: Vec<(String, String, String)> = content
        .iter()
        .filter(|b| b["type"] == "tool-call")
        .map(|b| {
            let text = |k: &str| b[k].as_str().unwrap_or_default().to_string();
            (text("id"), text("name"), text("arguments"))
        })
        .collect();
    if calls.is_empty() {
        return StepEnd::Done;
    }
    run_tools(session, deps, &tools, turn, step, calls, cancel).await;
    StepEnd::Continue
}

/// Runs the step's calls: runs of parallel-safe calls share a bounded pool, every other call is
/// a barrier. Results are appended in call order; calls never dispatched because of cancellation
/// get `Error: tool call aborted before dispatch`.
async fn run_tools(
    session: &mut Session,
    deps: &AgentDeps,
    tools: &ToolRegistry,
    turn: u64,
    step: u64,
    calls: Vec<(String, String, String)>,
    cancel: &CancellationToken,
) {
    let mut batches: Vec<Vec<(String, String, String)>> = Vec::new();
    for call in calls {
        let parallel = tools.is_parallel_safe(&call.1);
        match batches.last_mut() {
            Some(batch) if parallel && batch.iter().all(|c| tools.is_parallel_safe(&c.1)) => batch.push(call),
            _ => batches.push(vec![call]),
        }
    }
    for batch in batches {
        let mut seqs = Vec::new();
        for (id, name, arguments) in &batch {
            seqs.push(session.append(
                "tool/call",
                json!({"turn": turn, "step": step, "callId": id, "name": name, "arguments": arguments}),
            ));
        }
        // A crash while tools run must leave their `tool/call` on disk (outcome unknown, not lost).
        session.write_eager();
        let needs_history = batch.iter().any(|(_, name, _)| tools.get(name).is_some_and(|t| t.needs_history()));
        let caller = Arc::new(Caller {
            header: session.header.clone(),
            depth: session.header.delegation_depth.max(deps.depth),
            route: deps.route.clone(),
            history: needs_history.then(|| Arc::new(completed_prefix(session.events()).to_vec())),
        });
        let results: Vec<Result<ToolOutput, ToolError>> = if cancel.is_cancelled() {
            batch.iter().map(|_| Err(aborted("tool call aborted before dispatch", "ABORTED_BEFORE_DISPATCH"))).collect()
        } else {
            let cwd = session.header.cwd.clone().map(Into::into);
            let session_id = session.id().to_string();
            let (progress_tx, mut progress_rx) = tokio::sync::mpsc::unbounded_channel();
            let calls: Vec<BoxFuture<'static, Result<ToolOutput, ToolError>>> = batch
                .iter()
                .map(|(id, name, arguments)| {
                    let ctx = ToolContext {
                        session_id: session_id.clone(),
                        cwd: cwd.clone(),
                        call_id: id.clone(),
                        cancel: cancel.child_token(),
                        caller: Some(caller.clone()),
                        allow_outside: false,
                        file_access: deps.file_access.clone(),
                        progress: Some(Progress::new(id, progress_tx.clone())),
                    };
                    let (tools, name, arguments) = (tools.clone(), name.clone(), arguments.clone());
                    let (permissions, prompt) = (deps.permissions.clone(), deps.prompt.clone());
                    async move {
                        // The gate runs first: a refused call gets its error without running.
                        let ctx = admit(permissions, prompt, &tools, &name, &arguments, ctx).await?;
                        tools.call(&name, &arguments, ctx).await
                    }
                    .boxed()
                })
                .collect();
            drop(progress_tx);
            let running = futures::stream::iter(calls).buffered(deps.max_parallel_tools.max(1)).collect::<Vec<_>>();
            tokio::pin!(running);
            // Progress is recorded as it comes; what is still queued when the calls are done
            // goes in before their results.
            let results = loop {
                tokio::select! {
                    results = &mut running => break results,
                    Some((call_id, text)) = progress_rx.recv() => record_progress(session, turn, step, &call_id, text),
                }
            };
            while let Ok((call_id, text)) = progress_rx.try_recv() {
                record_progress(session, turn, step, &call_id, text);
            }
            results
        };
        for (((id, _, _), mut result), seq) in batch.iter().zip(results).zip(seqs) {
            let events = match &mut result {
                Ok(output) => &mut output.events,
                Err(error) => &mut error.events,
            };
            for (kind, data) in events.drain(..) {
                session.append(&kind, data);
            }
            session.append_surface("tool/result", tool_result(turn, step, id, result), Some(vec![seq]));
        }
    }
}

/// A running call's progress report as a log-only `tool/progress` event, written at once (the
/// turn goes back to waiting on its calls).
fn record_progress(session: &mut Session, turn: u64, step: u64, call_id: &str, text: String) {
    session.append("tool/progress", json!({"turn": turn, "step": step, "callId": call_id, "text": text}));
    session.write_eager();
}

fn aborted(message: &str, code: &str) -> ToolError {
    ToolError::named("AbortError", code, message)
}

fn tool_result(turn: u64, step: u64, call_id: &str, result: Result<ToolOutput, ToolError>) -> Value {
    let (content, is_error, error, meta) = match result {
        Ok(output) => (output.content, false, None, output.meta),
        Err(e) => (
            vec![json!({"type": "text", "text": format!("Error: {}", e.message)})],
            true,
            Some(json!({"name": e.name, "code": e.code})),
            None,
        ),
    };
    let mut data = json!({
        "turn": turn,
        "step": step,
        "message": {
            "source": {"kind": "tool", "callId": call_id},
            "content": [{"type": "tool-result", "toolCallId": call_id, "content": content, "isError": is_error}],
            "role": "user",
            "id": uuid::Uuid::new_v4().to_string(),
        },
    });
    if let Some(error) = error {
        data["error"] = error;
    }
    // Editor-only details (a write's diff): dsh's `tool/result` allows `meta`.
    if let Some(meta) = meta {
        data["meta"] = meta;
    }
    data
}
