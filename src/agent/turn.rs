//! One turn: `turn/start`, the user message, then steps (one model call plus the tool calls it
//! asked for) until the model stops without tool calls, the step limit, cancellation, or failure;
//! then `turn/end`. Everything is appended to the session as it happens. A step the context
//! window overflowed ends its turn after a compaction, and a `retry` turn asks again (dsh's
//! overflow recovery, `compact::recover_overflow`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::compact::Overflow;
use super::intake::Intake;
use super::{AgentDeps, TurnEnd};
use crate::model::http::{CONTEXT_WINDOW_EXCEEDED, EMPTY_RESPONSE};
use crate::model::{Failure, FinishReason, ModelEvent, ModelRequest, Purpose, RetryInfo, StreamChunk};
use crate::permission::admit;
use crate::session::event::{self, EventBody, InboxSplice, InboxTarget, ToolCallBlock, TurnEndReason};
use crate::session::{Event, Kind, Session};
use crate::tools::{Caller, Progress, ToolContext, ToolError, ToolOutput, ToolRegistry};

/// The balanced prefix of a log: every event through the last `turn/end` (empty if none), so
/// it never ends inside an open turn or on a dangling tool call.
pub fn completed_prefix(events: &[Event]) -> &[Event] {
    let end = events.iter().rposition(|e| e.kind == Kind::TurnEnd).map_or(0, |i| i + 1);
    &events[..end]
}

/// The session's log through its last `turn/end`, as written (what a fork copies). A log that
/// cannot be read back gives the resident events, which a seed refuses (they are not
/// contiguous) when any stayed on disk only: the fork fails rather than copying a partial log.
fn completed_history(session: &mut Session) -> Vec<Event> {
    let mut events = session.history().unwrap_or_else(|e| {
        tracing::error!(session = %session.id(), "reading the log back for a fork failed: {e:#}");
        session.events().to_vec()
    });
    let end = completed_prefix(&events).len();
    events.truncate(end);
    events
}

/// How one step ended.
enum StepEnd {
    /// The model answered without tool calls.
    Done,
    /// Tools ran; the model needs another step.
    Continue,
    /// The turn is over with this reason (already written to the log by the step).
    Over(TurnEnd),
    /// The request no longer fits the context window (`step/end` written, the turn still open).
    Overflow(Failure),
}

/// What starts a turn.
pub(super) struct TurnInput {
    pub message: event::UserMessage,
    pub preamble: Vec<EventBody>,
    /// The message came from the inbox: the turn starts with its claim.
    pub claim: bool,
    /// What the user typed, when the message is its expansion: the fallback title's words.
    pub typed: Option<String>,
}

pub(super) async fn run_turn(
    session: &mut Session,
    deps: &AgentDeps,
    input: TurnInput,
    cancel: CancellationToken,
    intake: &Intake,
    disposing: &AtomicBool,
) -> TurnEnd {
    let cancelled = || cancelled_end(disposing);
    let TurnInput { message, preamble, claim, typed } = input;
    let turn = session.next_turn();
    if claim {
        session.push(InboxSplice::claim(InboxTarget::NextTurn, 1));
    }
    session.push(event::TurnStart { turn, trigger: event::Trigger::message(message.source.clone()) });
    // The first prompt names the session (dsh's fallback title), until a title exists.
    let untitled = message.is_from_user() && !session.events().iter().any(|e| e.kind == Kind::SessionTitle);
    let title = match (untitled, &typed) {
        (false, _) => None,
        (true, Some(typed)) => event::SessionTitle::fallback_of(&[typed.as_str()], 0),
        (true, None) => event::SessionTitle::fallback(&message, 0),
    };
    let message_seq = session.push(message);
    if let Some(mut title) = title {
        title.message_seqs = vec![message_seq];
        session.push(title);
    }
    for body in preamble {
        session.push(body);
    }
    // The prompt is on disk before the model runs: a crash leaves a turn to repair, not nothing.
    session.write_eager();
    // Cancelled before it began (a prompt cancelled while it waited): no model call.
    if cancel.is_cancelled() {
        return end_turn(session, turn, cancelled());
    }
    let mut turn = turn;
    // Overflow recoveries since the last answer of the model (dsh resets on `assistant/message`).
    let mut overflows = 0;
    // The prompt's steps, its retry turns' included: a recovery opens a turn whose steps count
    // from 1 again, and one that overflows after every tool step would otherwise never end.
    let mut steps_left = u64::from(deps.max_steps);
    let mut last_step = 0;
    'turn: loop {
        let this_turn = steps_left;
        for step in 1..=this_turn {
            steps_left -= 1;
            last_step = step;
            // The tools of this step: a source's (MCP) changes show from the next step on.
            let tools = serving(session, intake, deps.tools.snapshot(&cancel)).await;
            super::compact::relieve_pressure(session, deps, &tools.schemas(), turn, &cancel).await;
            intake.land_staged(session, false);
            session.push(event::StepStart { turn, step });
            let end = run_step(session, deps, &tools, (turn, step), &cancel, intake, disposing).await;
            match end {
                StepEnd::Done => {
                    session.push(event::StepEnd { turn, step });
                    return end_turn(session, turn, TurnEndReason::Completed);
                }
                StepEnd::Continue => {
                    overflows = 0;
                    session.push(event::StepEnd { turn, step });
                    if cancel.is_cancelled() {
                        return end_turn(session, turn, cancelled());
                    }
                }
                StepEnd::Over(end) => return end,
                StepEnd::Overflow(failure) if steps_left == 0 => {
                    // No step is left for a retry turn: the provider's refusal stands.
                    let message = format!(
                        "{}; the prompt used all {} steps (its retry turns' included), so kin does not compact and ask again (raise agent.max_steps to allow more)",
                        failure.message, deps.max_steps
                    );
                    let failure = Failure { message, ..failure };
                    return end_turn(session, turn, TurnEndReason::Error { step, failure: Some(failure) });
                }
                StepEnd::Overflow(failure) => {
                    let schemas = tools.schemas();
                    let overflow = Overflow { turn, step, done: overflows, tools: &schemas };
                    match super::compact::recover_overflow(session, deps, overflow, &cancel).await {
                        Ok(()) => {
                            // dsh: the failed turn ends with the provider's error and a `retry`
                            // turn (no user message) asks again from the compacted history.
                            overflows += 1;
                            end_turn(session, turn, TurnEndReason::Error { step, failure: Some(failure) });
                            turn = session.next_turn();
                            session.push(event::TurnStart { turn, trigger: event::Trigger::retry() });
                            session.write_eager();
                            continue 'turn;
                        }
                        // Cancelled during the recovery: the prompt was called off, not failed.
                        Err(_) if cancel.is_cancelled() => return end_turn(session, turn, cancelled()),
                        Err(why) => {
                            let failure = Failure { message: format!("{}; {why}", failure.message), ..failure };
                            return end_turn(session, turn, TurnEndReason::Error { step, failure: Some(failure) });
                        }
                    }
                }
            }
        }
        break;
    }
    let failure = Failure::new(
        format!(
            "the model used all {} steps of this turn without a final answer (raise agent.max_steps to allow more)",
            deps.max_steps
        ),
        super::STEP_LIMIT,
    );
    end_turn(session, turn, TurnEndReason::Error { step: last_step, failure: Some(failure) })
}

/// How a cancelled turn ends: `disposed` when the agent is shutting down, else `aborted`.
fn cancelled_end(disposing: &AtomicBool) -> TurnEndReason {
    if disposing.load(Ordering::SeqCst) { TurnEndReason::Disposed } else { TurnEndReason::Aborted }
}

/// Writes `turn/end` and returns what the turn's caller hears: the same reason.
fn end_turn(session: &mut Session, turn: u64, reason: TurnEndReason) -> TurnEnd {
    let end = TurnEnd::from(&reason);
    session.push(event::TurnEnd { turn, reason });
    end
}

/// Ends the open step and the turn.
fn abandon(session: &mut Session, turn: u64, step: u64, reason: TurnEndReason) -> StepEnd {
    session.push(event::StepEnd { turn, step });
    StepEnd::Over(end_turn(session, turn, reason))
}

async fn run_step(
    session: &mut Session,
    deps: &AgentDeps,
    tools: &ToolRegistry,
    (turn, step): (u64, u64),
    cancel: &CancellationToken,
    intake: &Intake,
    disposing: &AtomicBool,
) -> StepEnd {
    let request = ModelRequest {
        session_id: session.id().to_string(),
        turn,
        step,
        cwd: session.header.cwd.as_ref().map(Into::into),
        route: deps.route.clone(),
        system: deps.system.clone(),
        messages: session.messages(),
        tools: tools.schemas(),
        purpose: Purpose::Step,
        max_tokens: None,
    };
    // A call that completes with no content is retried here, whatever the model (dsh's
    // retryable `EMPTY_RESPONSE`): each attempt's chunks are in the log, an `llm/retry` between.
    let max_attempts = deps.retry.max_attempts.max(1);
    let mut attempt = 1;
    let (finish, call) = loop {
        let call = call_model(session, deps, request.clone(), turn, step, cancel, intake).await;
        let finish = match call.outcome.clone() {
            Ok(FinishReason::Aborted { .. }) => {
                keep_partial(session, deps, turn, step, call);
                return abandon(session, turn, step, cancelled_end(disposing));
            }
            Ok(FinishReason::Error { failure }) | Err(failure) if failure.code == CONTEXT_WINDOW_EXCEEDED => {
                session.push(event::StepEnd { turn, step });
                return StepEnd::Overflow(failure);
            }
            Ok(FinishReason::Error { failure }) | Err(failure) => {
                // What streamed before the failure was shown: kept, as a cancelled call's is.
                keep_partial(session, deps, turn, step, call);
                return abandon(session, turn, step, TurnEndReason::Error { step, failure: Some(failure) });
            }
            Ok(finish) => finish,
        };
        if finish == FinishReason::MaxTokens || has_content(call.blocks.values()) {
            break (finish, call);
        }
        let mut failure = empty_response();
        if attempt >= max_attempts {
            if attempt > 1 {
                failure.message = format!("{} (gave up after {attempt} attempts)", failure.message);
            }
            tracing::warn!(session = %session.id(), turn, step, "model call failed: {}", failure.message);
            return abandon(session, turn, step, TurnEndReason::Error { step, failure: Some(failure) });
        }
        let delay = deps.retry.delay(attempt, None);
        attempt += 1;
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let (code, reason) = (failure.code, failure.message);
        write_retry(
            session,
            RetryInfo { attempt, max_attempts, delay_ms, code, reason, requested_delay_ms: None },
            Some(turn),
            step,
        );
        session.write_eager();
        tokio::select! {
            biased;
            () = cancel.cancelled() => return abandon(session, turn, step, cancelled_end(disposing)),
            () = serving(session, intake, tokio::time::sleep(delay)) => {}
        }
    };
    let Call { blocks, usage, chunk_seqs, .. } = call;
    let blocks = unique_call_ids(blocks.into_values().collect());
    let message = event::ModelMessage::new(blocks, &deps.route.provider, &deps.route.model);
    let calls = message.tool_calls();
    session.push_from(event::AssistantMessage { turn, step, message, usage }, chunk_seqs);
    if finish == FinishReason::MaxTokens {
        // The calls of a cut-off response are not run, and each says so: a call without a result
        // would make every later request of the session one the model's API refuses.
        for call in &calls {
            session.push(crate::session::repair::not_run(turn, step, &call.id, crate::session::repair::CUT_OFF_TEXT));
        }
        return abandon(session, turn, step, TurnEndReason::MaxTokens);
    }
    if calls.is_empty() {
        return StepEnd::Done;
    }
    run_tools(session, deps, tools, (turn, step), calls, cancel, intake).await;
    StepEnd::Continue
}

/// Awaits `work` while writing the messages that arrive meanwhile. Work that is ready wins (a
/// biased select): a message waiting when the step's tools are ready lands after `step/start`,
/// at the model call, so the log's order does not depend on the select's random pick.
async fn serving<F: std::future::Future>(session: &mut Session, intake: &Intake, work: F) -> F::Output {
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return out,
            () = intake.arrived() => intake.accept(session, true),
        }
    }
}

/// What one model call gave the step.
struct Call {
    outcome: Result<FinishReason, Failure>,
    /// The finished blocks by index.
    blocks: BTreeMap<u64, Value>,
    /// The text streamed so far, by block: what the user saw if the stream is cut off.
    texts: BTreeMap<u64, String>,
    usage: Option<Value>,
    /// The seqs of the call's `assistant/chunk` events.
    chunk_seqs: Vec<u64>,
}

/// One model call: every chunk goes into the log as it comes.
async fn call_model(
    session: &mut Session,
    deps: &AgentDeps,
    request: ModelRequest,
    turn: u64,
    step: u64,
    cancel: &CancellationToken,
    intake: &Intake,
) -> Call {
    let mut stream = deps.model.stream(request, cancel.child_token());
    let mut call = Call {
        outcome: Ok(FinishReason::Stop),
        blocks: BTreeMap::new(),
        texts: BTreeMap::new(),
        usage: None,
        chunk_seqs: Vec::new(),
    };
    call.outcome = loop {
        session.write_eager();
        let item = tokio::select! {
            biased;
            () = cancel.cancelled() => break Ok(FinishReason::Aborted { failure: None }),
            // While the editor is far behind, the stream waits (see `outflow`).
            item = async {
                crate::outflow::outflow().room().await;
                stream.recv().await
            } => item,
            () = intake.arrived() => {
                intake.accept(session, true);
                continue;
            }
        };
        match item {
            // Word of a retry comes in band, before the retried attempt's first chunk.
            Some(Ok(ModelEvent::Retry(retry))) => write_retry(session, retry, Some(turn), step),
            Some(Ok(ModelEvent::Chunk(chunk))) => {
                // What the step keeps of a chunk is taken before the chunk goes into the log.
                let finish = match &chunk {
                    StreamChunk::BlockEnd { index, block } => {
                        call.blocks.insert(*index, block.clone());
                        None
                    }
                    StreamChunk::TextDelta { index, text } => {
                        call.texts.entry(*index).or_default().push_str(text);
                        None
                    }
                    StreamChunk::Usage { usage } => {
                        call.usage = Some(usage.clone());
                        None
                    }
                    StreamChunk::Finish { reason, .. } => Some(reason.clone()),
                    _ => None,
                };
                call.chunk_seqs.push(session.push(event::AssistantChunk { turn, step, chunk }));
                if let Some(reason) = finish {
                    break Ok(reason);
                }
            }
            Some(Err(failure)) => break Err(failure),
            None => {
                break Err(Failure::new("the model stream ended without a finish", "STREAM_INCOMPLETE"));
            }
        }
    };
    call
}

/// Writes a retry of the model call serving `turn` (`None`: a `/compact` summary between turns)
/// and `step` as `llm/retry` (which the editor shows as a thought).
pub(super) fn write_retry(session: &mut Session, retry: RetryInfo, turn: Option<u64>, step: u64) {
    let RetryInfo { attempt, delay_ms, code, reason, .. } = &retry;
    tracing::warn!(session = %session.id(), turn, step, attempt, delay_ms, code = %code, "model call failed, retrying: {reason}");
    session.push(retry.event(turn, step));
}

/// What a kept partial answer holds of each text block: its first and last 50 000 bytes, the
/// cut noted (a call stopped for streaming past the response limit sent up to 64 MiB, which the
/// history would otherwise send with every later request).
const KEPT_PARTIAL: crate::tools::capture::Limits = crate::tools::capture::Limits { head: 50_000, tail: 50_000 };

/// A cancelled or failed call's text stays in the log (and the history) as an `assistant/message`:
/// its text blocks as far as they streamed (a finished one whole), each bounded by `KEPT_PARTIAL`,
/// without reasoning or half-streamed tool calls, and no usage. A call cut off before any text
/// writes nothing.
fn keep_partial(session: &mut Session, deps: &AgentDeps, turn: u64, step: u64, call: Call) {
    let Call { mut blocks, texts, chunk_seqs, .. } = call;
    let partial: Vec<Value> = texts
        .into_iter()
        .filter(|(_, text)| !text.is_empty())
        .map(|(index, text)| {
            let mut block = match blocks.remove(&index) {
                Some(block) if block["type"] == "text" => block,
                _ => json!({"type": "text", "text": text}),
            };
            if let Some(long) = block["text"].as_str().filter(|t| t.len() > KEPT_PARTIAL.total()) {
                block["text"] = json!(crate::tools::capture::ends_of(long, KEPT_PARTIAL));
            }
            block
        })
        .collect();
    if partial.is_empty() {
        return;
    }
    let message = event::ModelMessage::new(partial, &deps.route.provider, &deps.route.model);
    session.push_from(event::AssistantMessage { turn, step, message, usage: None }, chunk_seqs);
}

/// True when a finished response holds something: a text or reasoning block with text, or a
/// tool call.
fn has_content<'a>(blocks: impl IntoIterator<Item = &'a Value>) -> bool {
    blocks.into_iter().any(|block| match block["type"].as_str() {
        Some("text" | "reasoning") => block["text"].as_str().is_some_and(|t| !t.is_empty()),
        Some("tool-call") => true,
        _ => false,
    })
}

/// The response's blocks with every tool call's id made unique: a model that gives two calls
/// one id (or none) would get two results of that id back, which model APIs refuse, and the editor
/// two calls it cannot tell apart. A repeated id becomes `<id>-2` (`-3`, …: the first free one);
/// the stream's chunks in the log keep what the model sent.
fn unique_call_ids(mut blocks: Vec<Value>) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    let taken: std::collections::HashSet<String> = blocks
        .iter()
        .filter(|b| b["type"] == "tool-call")
        .filter_map(|b| b["id"].as_str().map(str::to_string))
        .collect();
    for block in blocks.iter_mut().filter(|b| b["type"] == "tool-call") {
        let id = block["id"].as_str().unwrap_or_default().to_string();
        if seen.insert(id.clone()) && !id.is_empty() {
            continue;
        }
        let base = if id.is_empty() { "call".to_string() } else { id.clone() };
        let fresh =
            (2..).map(|n| format!("{base}-{n}")).find(|c| !taken.contains(c) && !seen.contains(c)).unwrap_or(base);
        tracing::warn!(id = %id, renamed = %fresh, "the model gave a tool call an id already used in its response");
        seen.insert(fresh.clone());
        block["id"] = Value::String(fresh);
    }
    blocks
}

/// The failure of a call that completed with no content.
fn empty_response() -> Failure {
    Failure::new("the model returned an empty completion (no text, reasoning or tool calls)", EMPTY_RESPONSE)
}

/// The tool calls one step runs at most; the model's calls past them are answered
/// `TOO_MANY_TOOL_CALLS` without running (a response may carry any number of calls, and a run of
/// parallel-safe ones holds its results together).
pub(crate) const MAX_TOOL_CALLS_PER_STEP: usize = 64;

/// Runs the step's calls: runs of parallel-safe calls share a bounded pool, every other call is
/// a barrier. Results are appended in call order; calls never dispatched because of cancellation
/// get `Error: tool call aborted before dispatch`, and calls past `MAX_TOOL_CALLS_PER_STEP` an
/// error saying so.
async fn run_tools(
    session: &mut Session,
    deps: &AgentDeps,
    tools: &ToolRegistry,
    (turn, step): (u64, u64),
    mut calls: Vec<ToolCallBlock>,
    cancel: &CancellationToken,
    intake: &Intake,
) {
    let over = calls.split_off(calls.len().min(MAX_TOOL_CALLS_PER_STEP));
    // Each batch, and whether it runs: the calls past the cap are one batch that does not.
    let mut batches: Vec<(Vec<ToolCallBlock>, bool)> = Vec::new();
    for call in calls {
        let parallel = tools.is_parallel_safe(&call.name);
        match batches.last_mut() {
            // A run of parallel-safe calls: the batch's first call tells (they all are).
            Some((batch, _)) if parallel && batch.first().is_some_and(|c| tools.is_parallel_safe(&c.name)) => {
                batch.push(call);
            }
            _ => batches.push((vec![call], true)),
        }
    }
    if !over.is_empty() {
        batches.push((over, false));
    }
    for (batch, runs) in batches {
        let mut seqs = Vec::new();
        for call in &batch {
            let (call_id, name, arguments) = (call.id.clone(), call.name.clone(), call.arguments.clone());
            seqs.push(session.push(event::ToolCall { turn, step, call_id, name, arguments }));
        }
        // A crash while tools run must leave their `tool/call` on disk (outcome unknown, not lost).
        session.write_eager();
        let needs_history = batch.iter().any(|c| tools.get(&c.name).is_some_and(|t| t.needs_history()));
        let caller = Arc::new(Caller {
            header: session.header.clone(),
            depth: session.header.delegation_depth.max(deps.depth),
            route: deps.route.clone(),
            history: needs_history.then(|| Arc::new(completed_history(session))),
        });
        let results: Vec<Result<ToolOutput, ToolError>> = if !runs {
            batch.iter().map(|_| Err(too_many_calls())).collect()
        } else if cancel.is_cancelled() {
            batch.iter().map(|_| Err(aborted("tool call aborted before dispatch", "ABORTED_BEFORE_DISPATCH"))).collect()
        } else {
            let cwd = session.header.cwd.clone().map(Into::into);
            let session_id = session.id().to_string();
            let (progress_tx, mut progress_rx) = tokio::sync::mpsc::unbounded_channel();
            let calls: Vec<BoxFuture<'static, Result<ToolOutput, ToolError>>> = batch
                .iter()
                .map(|ToolCallBlock { id, name, arguments }| {
                    let ctx = ToolContext {
                        session_id: session_id.clone(),
                        cwd: cwd.clone(),
                        call_id: id.clone(),
                        cancel: cancel.child_token(),
                        caller: Some(caller.clone()),
                        allow_outside: false,
                        allow_unsandboxed: false,
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
                    () = intake.arrived() => intake.accept(session, true),
                }
            };
            while let Ok((call_id, text)) = progress_rx.try_recv() {
                record_progress(session, turn, step, &call_id, text);
            }
            results
        };
        for ((call, mut result), seq) in batch.iter().zip(results).zip(seqs) {
            let events = match &mut result {
                Ok(output) => &mut output.events,
                Err(error) => &mut error.events,
            };
            for body in events.drain(..) {
                session.push(body);
            }
            session.push_from(tool_result(turn, step, &call.id, result), vec![seq]);
        }
    }
}

/// A running call's progress report as a log-only `tool/progress` event, written at once (the
/// turn goes back to waiting on its calls).
fn record_progress(session: &mut Session, turn: u64, step: u64, call_id: &str, text: String) {
    session.push(event::ToolProgress { turn, step, call_id: call_id.to_string(), text });
    session.write_eager();
}

/// The error of a call past `MAX_TOOL_CALLS_PER_STEP`.
fn too_many_calls() -> ToolError {
    ToolError::new(
        "TOO_MANY_TOOL_CALLS",
        format!(
            "not run: a step runs at most {MAX_TOOL_CALLS_PER_STEP} tool calls and this one asked for more; make the \
             calls that are still needed in the next step"
        ),
    )
}

fn aborted(message: &str, code: &str) -> ToolError {
    ToolError::named("AbortError", code, message)
}

/// A call's `tool/result`: its blocks, or `Error: <message>` with the error's name and code.
/// Editor-only details (a write's diff) go into dsh's `meta`.
fn tool_result(turn: u64, step: u64, call_id: &str, result: Result<ToolOutput, ToolError>) -> event::ToolResult {
    match result {
        Ok(output) => event::ToolResult::new(turn, step, call_id, output.content, None, output.meta),
        Err(e) => {
            let content = vec![json!({"type": "text", "text": format!("Error: {}", e.message)})];
            let error = event::ToolFailure { name: e.name, code: e.code };
            event::ToolResult::new(turn, step, call_id, content, Some(error), None)
        }
    }
}
