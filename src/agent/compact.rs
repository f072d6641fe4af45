//! Compaction (dsh `compact-basic`, ../shared/reference/compaction.md): the head of the model
//! history is replaced by a model-written checkpoint while a verbatim tail stays. `select` picks
//! the range (from the head, leaving at least `retain` tokens, never splitting a tool call from
//! its result); `compact` is the transaction: `compact/start`, the summary call (purpose
//! compaction, not a step: nothing of it streams into the log), `compact/summary`, the
//! checkpoint `user/message` with `surfaceOp {op: replace, start, end}` and
//! `sourceEventSeqs [start, summary, ...shadowed]`, then `compact/end` (with `error` on any
//! failure after the start, the surface unchanged). The replacement is one event, so a log cut
//! anywhere folds to the history before or after it. `relieve_pressure` runs at the start of a
//! step when the measured next request reaches the threshold; `recover_overflow` after a step
//! the provider refused as too long for the context window.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::AgentDeps;
use super::meter;
use super::summary_input;
use crate::model::capacity::ModelTable;
use crate::model::http::CONTEXT_WINDOW_EXCEEDED;
use crate::model::{FinishReason, ModelEvent, ModelRequest, ModelRoute, Purpose, StreamChunk, ToolSchema};
use crate::session::Session;
use crate::session::estimate::message_tokens;
use crate::session::event::{CompactEnd, CompactStart, CompactSummary, SeqRange, UserMessage};

/// The instruction that ends the summary request (dsh's, exact).
pub(crate) const INSTRUCTION: &str = include_str!("compact_instruction.txt");

/// What precedes the summary in a checkpoint (dsh's, exact).
pub(crate) const PREAMBLE: &str = "This is an automatically generated checkpoint condensing an earlier span of the conversation to free up context. Treat the captured context as established background and build on it without restating it. Continue the task directly from the messages that follow, without acknowledging this checkpoint.";

/// How a session compacts (`[compaction]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Compact at the start of a step when the next request reaches this share of the window.
    pub threshold_ratio: f64,
    /// The share of the window kept verbatim at the tail.
    pub retain_ratio: f64,
    /// The summary call's output cap.
    pub max_tokens: u32,
    /// Compact automatically (pressure and overflow); `/compact` works either way.
    pub auto: bool,
    /// Overflow recoveries (compact, then retry) per turn.
    pub max_overflow_retries: u32,
    /// The route that writes summaries; `None`: the session's own.
    pub summary_route: Option<ModelRoute>,
    /// Where each route's context window comes from.
    pub models: Arc<ModelTable>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            threshold_ratio: 0.8,
            retain_ratio: 0.16,
            max_tokens: 8192,
            auto: true,
            max_overflow_retries: 1,
            summary_route: None,
            models: Arc::default(),
        }
    }
}

/// What a compaction replaced (over all its rounds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compacted {
    /// How many history items it shadowed.
    pub items: usize,
    /// Their estimated tokens.
    pub tokens: u64,
    /// The checkpoint's estimated tokens.
    pub checkpoint: u64,
    /// Why a later round failed after earlier ones replaced history: the rest of the range is
    /// as it was.
    pub unfinished: Option<String>,
}

impl Compacted {
    /// What the user is told of a range left unfinished (nothing when it was all compacted).
    fn rest(&self) -> String {
        self.unfinished.as_ref().map_or_else(String::new, |why| {
            format!(" The rest of the history was not compacted ({why}); run /compact again to go on.")
        })
    }

    /// This compaction followed by `next`, whose range began with this one's checkpoint.
    fn then(self, next: &Compacted) -> Compacted {
        Compacted {
            items: self.items + next.items - 1,
            tokens: self.tokens + next.tokens - self.checkpoint,
            checkpoint: next.checkpoint,
            unfinished: next.unfinished.clone(),
        }
    }
}

/// Whether each cut keeps every tool call with its result on the same side: entry `i` is for
/// the cut before `messages[i]` (the calls before it minus the results before it is 0).
fn balanced_cuts(messages: &[Value]) -> Vec<bool> {
    let mut open: i64 = 0;
    let mut cuts = Vec::with_capacity(messages.len() + 1);
    cuts.push(true);
    for message in messages {
        for block in message["content"].as_array().map_or(&[][..], Vec::as_slice) {
            match block["type"].as_str() {
                Some("tool-call") => open += 1,
                Some("tool-result") => open -= 1,
                _ => {}
            }
        }
        cuts.push(open == 0);
    }
    cuts
}

/// How many nodes from the head to shadow so that at least `retain` tokens stay at the tail
/// (the newest node always stays) and the cut is balanced (`balanced`, from `balanced_cuts`);
/// `None` when nothing can go.
pub(crate) fn select(balanced: &[bool], tokens: &[u64], retain: u64) -> Option<usize> {
    let mut sum = 0;
    let mut keep = 0;
    for i in (0..tokens.len()).rev() {
        sum += tokens[i];
        if sum >= retain {
            keep = i;
            break;
        }
    }
    while keep > 0 && !balanced[keep] {
        keep -= 1;
    }
    (keep > 0).then_some(keep)
}

/// The checkpoint's content: the preamble, then the summary inside `<compacted-summary>`.
pub(crate) fn checkpoint(summary: &[Value]) -> Vec<Value> {
    let mut content = vec![json!({"type": "text", "text": format!("{PREAMBLE}\n\n<compacted-summary>")})];
    content.extend(summary.iter().cloned());
    content.push(json!({"type": "text", "text": "</compacted-summary>"}));
    content
}

/// The estimated tokens of the checkpoint that frames `summary`.
pub(crate) fn checkpoint_tokens(summary: &[Value]) -> u64 {
    message_tokens(&json!({"content": checkpoint(summary)}))
}

/// The instruction of a summary request, with the user's focus (`/compact FOCUS`) after it.
fn instruction(focus: Option<&str>) -> String {
    match focus.map(str::trim).filter(|f| !f.is_empty()) {
        Some(focus) => format!("{INSTRUCTION}\n\nThe user asked this checkpoint to focus on: {focus}"),
        None => INSTRUCTION.to_string(),
    }
}

/// One compaction's inputs beyond the session.
pub(crate) struct Request<'a> {
    pub deps: &'a AgentDeps,
    pub tools: &'a [ToolSchema],
    /// The open turn (automatic), or `None` (`/compact` between turns).
    pub turn: Option<u64>,
    /// Tokens to keep verbatim at the tail (0: only the newest item).
    pub retain: u64,
    pub focus: Option<&'a str>,
    pub cancel: &'a CancellationToken,
}

/// At most this many summary calls per compaction: a history too large for the summariser's
/// window in one call is summarised head first, each round's checkpoint merged into the next.
pub(crate) const MAX_ROUNDS: u32 = 8;

/// Compacts the head of `session`'s history, writing the transaction at once (unsynced, as a
/// turn writes). `Ok(None)`: nothing to compact, nothing written. An error after `compact/start`
/// is recorded in `compact/end` and leaves the history as it was.
pub(crate) async fn compact(session: &mut Session, request: Request<'_>) -> Result<Option<Compacted>, String> {
    rounds(session, &request).await.transpose()
}

/// How many times a compaction's summary request may be refused as too long for the window
/// (each time it is sent again with half the history): the estimate undercounts some texts.
const MAX_REFUSALS: u32 = 3;

/// Compacts in rounds (each one transaction, written at once) until the range `request.retain`
/// leaves is summarised, at most `MAX_ROUNDS` summary calls: `None` when nothing could be
/// compacted (nothing is written then). A summary request the provider refuses as too long is
/// recorded and sent again with at most half the history it carried (`MAX_REFUSALS` times). A
/// round that fails after an earlier one replaced history ends the compaction with that
/// progress, the failure in `Compacted::unfinished`.
async fn rounds(session: &mut Session, request: &Request<'_>) -> Option<Result<Compacted, String>> {
    let mut done: Option<Compacted> = None;
    let mut limit = None;
    let mut refusals = 0;
    for _ in 0..MAX_ROUNDS {
        let round = transact(session, request, limit).await;
        session.write_eager();
        match (round, done.take()) {
            (None, so_far) => return so_far.map(Ok),
            (Some(Err(failed)), so_far)
                if failed.refused_at.is_some() && refusals < MAX_REFUSALS && !request.cancel.is_cancelled() =>
            {
                refusals += 1;
                limit = failed.refused_at.map(|sent| sent / 2);
                done = so_far;
            }
            (Some(Err(failed)), None) => return Some(Err(failed.why)),
            (Some(Err(failed)), Some(so_far)) => {
                return Some(Ok(Compacted { unfinished: Some(failed.why), ..so_far }));
            }
            (Some(Ok((this, whole))), so_far) => {
                done = Some(match so_far {
                    Some(so_far) => so_far.then(&this),
                    None => this,
                });
                if whole {
                    return done.map(Ok);
                }
            }
        }
        if request.cancel.is_cancelled() {
            return done.map(|so_far| Ok(Compacted { unfinished: Some("compaction cancelled".into()), ..so_far }));
        }
    }
    done.map(|so_far| Compacted {
        unfinished: Some(format!("the range took more than {MAX_ROUNDS} summary calls")),
        ..so_far
    })
    .map(Ok)
}

/// Why a round failed.
struct Failed {
    why: String,
    /// When the provider refused the summary request as too long: the estimated tokens of the
    /// history it carried.
    refused_at: Option<u64>,
}

impl From<String> for Failed {
    fn from(why: String) -> Failed {
        Failed { why, refused_at: None }
    }
}

/// One transaction, queued through `compact/end` (the caller writes it): `None` when nothing can
/// be compacted (nothing is appended then), else whether the history was replaced, and whether
/// the whole range `request.retain` leaves was (not only the head the summariser's window took).
/// `limit`: at most this many estimated tokens of history go in the summary request.
async fn transact(
    session: &mut Session,
    request: &Request<'_>,
    limit: Option<u64>,
) -> Option<Result<(Compacted, bool), Failed>> {
    let messages = session.messages();
    let tokens: Vec<u64> = messages.iter().map(message_tokens).collect();
    let balanced = balanced_cuts(&messages);
    let wanted = select(&balanced, &tokens, request.retain)?;
    let room = match (summary_room(request), limit) {
        (Some(room), Some(limit)) => Some(room.min(limit)),
        (room, limit) => room.or(limit),
    };
    // A round over less than a summary may hold (the output cap) would not shrink it.
    let min_progress = u64::from(output_cap(request.deps));
    let fitted = summary_input::fit(&messages, &tokens, wanted, room, &balanced, min_progress);
    let turn = request.turn;
    let start = session.push(CompactStart { turn });
    session.write_eager();
    let result = match fitted {
        Ok(fitted) => {
            let keep = fitted.keep;
            let shadowed: Vec<u64> = session.surface_seqs()[..keep].to_vec();
            let shadowed_tokens: u64 = tokens[..keep].iter().sum();
            commit(session, request, fitted.input, &shadowed, shadowed_tokens, start)
                .await
                .map(|done| (done, keep == wanted))
        }
        Err(e) => Err(Failed::from(e)),
    };
    let error = result.as_ref().err().map(|failed| failed.why.clone());
    session.push(CompactEnd { turn, error });
    Some(result)
}

/// The route that writes the summaries.
fn summariser(deps: &AgentDeps) -> ModelRoute {
    deps.compaction.summary_route.clone().unwrap_or_else(|| deps.route.clone())
}

/// The summary call's output cap: `max_tokens`, but at most a quarter of the summariser's
/// window (a small local model's window is not all taken by the answer).
fn output_cap(deps: &AgentDeps) -> u32 {
    let policy = &deps.compaction;
    match policy.models.info(&summariser(deps)).context_window {
        Some(window) => policy.max_tokens.min(u32::try_from(window / 4).unwrap_or(u32::MAX)),
        None => policy.max_tokens,
    }
}

/// How many estimated tokens of history a summary request has room for in the summariser's
/// window (`None`: its window is not known): the window less the output cap and a twentieth
/// for the estimate's error, less the system prompt, the tools and the instruction.
fn summary_room(request: &Request<'_>) -> Option<u64> {
    let deps = request.deps;
    let window = deps.compaction.models.info(&summariser(deps)).context_window?;
    let room = window.saturating_sub(u64::from(output_cap(deps))).saturating_sub(window / 20);
    let header = meter::header_tokens(&deps.system, request.tools);
    let instruction = message_tokens(&instruction_message(request.focus));
    Some(room.saturating_sub(header + instruction))
}

/// The user message that ends a summary request (never logged).
fn instruction_message(focus: Option<&str>) -> Value {
    json!({
        "role": "user",
        "content": [{"type": "text", "text": instruction(focus)}],
        "source": {"kind": "plugin", "plugin": "dsh-compact-basic"},
    })
}

/// The summary call and the replacement, between `compact/start` and `compact/end`.
async fn commit(
    session: &mut Session,
    request: &Request<'_>,
    mut input: Vec<Value>,
    shadowed: &[u64],
    tokens: u64,
    start: u64,
) -> Result<Compacted, Failed> {
    let deps = request.deps;
    let route = summariser(deps);
    let sent: u64 = input.iter().map(message_tokens).sum();
    input.push(instruction_message(request.focus));
    let call = ModelRequest {
        session_id: session.id().to_string(),
        turn: request.turn.unwrap_or(0),
        step: 0,
        cwd: session.header.cwd.as_ref().map(Into::into),
        route: route.clone(),
        system: deps.system.clone(),
        messages: Arc::new(input),
        tools: request.tools.to_vec(),
        purpose: Purpose::Compaction,
        max_tokens: Some(output_cap(deps)),
    };
    let (raw, usage) = summarize(session, deps, call, request.turn, request.cancel)
        .await
        .map_err(|(why, too_long)| Failed { why, refused_at: too_long.then_some(sent) })?;
    let summary: Vec<Value> = raw.iter().filter(|b| b["type"] == "text").cloned().collect();
    if summary.iter().all(|b| b["text"].as_str().is_none_or(|t| t.trim().is_empty())) {
        return Err(Failed::from("summarization produced no text summary content".to_string()));
    }
    let content = checkpoint(&summary);
    let framed = checkpoint_tokens(&summary);
    if framed >= tokens {
        return Err(Failed::from(format!(
            "summary is not smaller than the shadowed content ({framed} estimated framed tokens >= {tokens})"
        )));
    }
    if session.surface_seqs().get(..shadowed.len()) != Some(shadowed) {
        return Err(Failed::from("compaction: session surface changed during summarization".to_string()));
    }
    let (first, last) = (shadowed[0], shadowed[shadowed.len() - 1]);
    let summary_seq = session.push(CompactSummary {
        summary,
        raw_output: Some(raw),
        shadowed_range: SeqRange { start: first, end: last },
        shadowed_seqs: shadowed.to_vec(),
        shadowed_token_count: tokens,
        provider: route.provider,
        model: route.model,
        max_tokens: Some(output_cap(deps)),
        usage,
    });
    let message = UserMessage::new(content, json!({"kind": "plugin", "plugin": "compact"}));
    let sources = [vec![start, summary_seq], shadowed.to_vec()].concat();
    session.push_replace(message, first, last, sources).map_err(|e| Failed::from(format!("compaction: {e}")))?;
    Ok(Compacted { items: shadowed.len(), tokens, checkpoint: framed, unfinished: None })
}

/// Runs the summary call: every finished block and the usage, or why it failed and whether the
/// provider refused the request as too long for the window. A retry of the call is written as
/// it comes (`llm/retry`, with the compaction's `turn`, `None` for `/compact` between turns, and
/// the call's step).
async fn summarize(
    session: &mut Session,
    deps: &AgentDeps,
    call: ModelRequest,
    turn: Option<u64>,
    cancel: &CancellationToken,
) -> Result<(Vec<Value>, Option<Value>), (String, bool)> {
    let step = call.step;
    let mut stream = deps.model.stream(call, cancel.child_token());
    let mut blocks = std::collections::BTreeMap::new();
    let mut usage = None;
    let refused = |failure: crate::model::Failure| {
        let too_long = failure.code == CONTEXT_WINDOW_EXCEEDED;
        (failure.message, too_long)
    };
    let plain = |why: &str| (why.to_string(), false);
    loop {
        let item = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(plain("compaction cancelled")),
            item = stream.recv() => item,
        };
        let chunk = match item {
            Some(Ok(ModelEvent::Chunk(chunk))) => chunk,
            Some(Ok(ModelEvent::Retry(retry))) => {
                super::turn::write_retry(session, retry, turn, step);
                continue;
            }
            Some(Err(failure)) => return Err(refused(failure)),
            None => return Err(plain("the summary stream ended without a finish")),
        };
        match chunk {
            StreamChunk::BlockEnd { index, block } => {
                blocks.insert(index, block);
            }
            StreamChunk::Usage { usage: u } => usage = Some(u),
            StreamChunk::Finish { reason, .. } => {
                return match reason {
                    FinishReason::Stop | FinishReason::ToolCalls => Ok((blocks.into_values().collect(), usage)),
                    FinishReason::MaxTokens => {
                        Err(plain("summarization truncated at the token cap (incomplete checkpoint)"))
                    }
                    FinishReason::Aborted { .. } => Err(plain("compaction cancelled")),
                    FinishReason::Error { failure } => Err(refused(failure)),
                };
            }
            _ => {}
        }
    }
}

/// Compacts at the start of a step of `turn` when the next request reaches the threshold of the
/// route's window (dsh's pressure). A failure is logged and the step goes on with the history
/// as it is.
pub(crate) async fn relieve_pressure(
    session: &mut Session,
    deps: &AgentDeps,
    tools: &[ToolSchema],
    turn: u64,
    cancel: &CancellationToken,
) {
    let policy = &deps.compaction;
    if !policy.auto || cancel.is_cancelled() {
        return;
    }
    let Some(window) = policy.models.info(&deps.route).context_window else {
        return;
    };
    let threshold = (window as f64 * policy.threshold_ratio).floor() as u64;
    let retain = (window as f64 * policy.retain_ratio).floor() as u64;
    let over = |session: &Session| {
        let total = meter::measure(session, &deps.route, &deps.system, tools).total;
        (total >= threshold).then_some(total)
    };
    if over(session).is_none() {
        return;
    }
    // dsh's default: one more attempt after the first.
    const ATTEMPTS: u32 = 2;
    for _ in 0..ATTEMPTS {
        let request = Request { deps, tools, turn: Some(turn), retain, focus: None, cancel };
        match compact(session, request).await {
            Ok(None) => return,
            Ok(Some(done)) => {
                tracing::info!(
                    session = %session.id(),
                    "compaction (step pressure): shadowed {} surface nodes (~{} tokens)",
                    done.items,
                    done.tokens
                );
            }
            Err(e) => {
                tracing::warn!(session = %session.id(), "step compaction failed: {e}; continuing the turn");
                return;
            }
        }
        if over(session).is_none() {
            return;
        }
    }
    if let Some(total) = over(session) {
        tracing::warn!(
            session = %session.id(),
            "compaction still above threshold after {ATTEMPTS} compaction attempts ({total} estimated tokens >= threshold {threshold})"
        );
    }
}

/// How `/compact` went (dsh's `command-compact` outcomes, and what kin adds when the session log
/// cannot be written).
#[derive(Debug, Clone, PartialEq)]
pub enum Manual {
    /// The history is replaced and the transaction is on disk (written and `fsync`ed).
    Compacted(Compacted),
    /// Nothing before the newest item to compact; nothing written.
    Nothing,
    /// A turn runs or a message waits for one.
    Busy,
    /// Cancelled before the history was replaced; the attempt is in the log, the history as it was.
    Cancelled,
    /// The attempt is recorded in the log (`compact/end` with the error); the history is as it was.
    Failed(String),
    /// The history was replaced in memory (the session goes on from the checkpoint), but the log
    /// could not be written (`cause`): the transaction stays queued and goes to disk with the
    /// session's next successful save; if kin stops before that, the session loads without it.
    Unsaved { done: Compacted, cause: String },
    /// The compaction did not happen (`why`: it failed or was cancelled; the history is as it was)
    /// and the log could not be written either (`cause`): nothing says the attempt is recorded.
    Unrecorded { why: String, cause: String },
}

impl Manual {
    /// What the user is told (dsh's texts, with the tokens after the compaction).
    pub fn text(&self) -> String {
        match self {
            Manual::Compacted(done) => format!(
                "Compacted {} history items (~{} tokens → ~{} tokens).{}",
                done.items,
                done.tokens,
                done.checkpoint,
                done.rest()
            ),
            Manual::Nothing => "No compactable history yet.".into(),
            Manual::Busy => {
                "Compaction is unavailable because this process has an active compaction, or the agent is not idle."
                    .into()
            }
            Manual::Cancelled => "Compaction cancelled.".into(),
            Manual::Failed(why) => format!(
                "Compaction could not produce a useful summary ({why}). The conversation is unchanged; the attempt is recorded in the session log."
            ),
            Manual::Unsaved { done, cause } => format!(
                "Compacted {} history items in memory (~{} tokens → ~{} tokens), but the session log could not be written ({cause}). \
                 This session continues from the compacted history and kin saves it with the session's next successful write; \
                 if kin stops before then, the session loads again with its history as it was before this compaction. \
                 Fix the cause (for example, free disk space) so that the session can be saved.{}",
                done.items,
                done.tokens,
                done.checkpoint,
                done.rest()
            ),
            Manual::Unrecorded { why, cause } => format!(
                "Compaction did not finish ({why}), and the session log could not be written ({cause}). \
                 The history is as it was before this compaction; the attempt is not in the session log yet. \
                 Fix the cause (for example, free disk space) so that the session can be saved."
            ),
        }
    }
}

/// `/compact`: everything but the newest item, between turns (`request.turn` is `None`). The
/// transaction is flushed (written and `fsync`ed) before the outcome is known: an outcome that
/// says the log holds it is given only once it does.
pub(crate) async fn manual(session: &mut Session, request: Request<'_>) -> Manual {
    let Some(result) = rounds(session, &request).await else {
        return Manual::Nothing;
    };
    let saved = session.flush().map_err(|e| format!("{e:#}"));
    match (result, saved) {
        (Ok(done), Ok(())) => Manual::Compacted(done),
        (Ok(done), Err(cause)) => Manual::Unsaved { done, cause },
        (Err(why), Err(cause)) => Manual::Unrecorded { why, cause },
        (Err(_), Ok(())) if request.cancel.is_cancelled() => Manual::Cancelled,
        (Err(why), Ok(())) => Manual::Failed(why),
    }
}

/// The step a context overflow ended.
pub(crate) struct Overflow<'a> {
    pub turn: u64,
    pub step: u64,
    /// Recoveries already made since the model last answered.
    pub done: u32,
    pub tools: &'a [ToolSchema],
}

/// Makes room after the provider said the request exceeds the context window (dsh's overflow
/// recovery): compacts everything but the newest item, inside the open turn. `Ok`: the history
/// shrank and the caller retries; `Err`: why it did not (added to the provider's error).
pub(crate) async fn recover_overflow(
    session: &mut Session,
    deps: &AgentDeps,
    overflow: Overflow<'_>,
    cancel: &CancellationToken,
) -> Result<(), String> {
    let policy = &deps.compaction;
    if !policy.auto {
        return Err(
            "automatic compaction is off ([compaction] auto = false): run /compact or start a new session".into()
        );
    }
    if overflow.done >= policy.max_overflow_retries {
        return Err(match overflow.done {
            0 => {
                "overflow recovery is off ([compaction] max_overflow_retries = 0): run /compact or start a new session"
                    .to_string()
            }
            n => format!(
                "it still did not fit after {n} compaction{} (max_overflow_retries = {}); start a new session or use a model with a larger window",
                if n == 1 { "" } else { "s" },
                policy.max_overflow_retries
            ),
        });
    }
    if cancel.is_cancelled() {
        return Err("the turn was cancelled before the history could be compacted".into());
    }
    let request = Request { deps, tools: overflow.tools, turn: Some(overflow.turn), retain: 0, focus: None, cancel };
    match compact(session, request).await {
        Ok(Some(done)) => {
            tracing::info!(
                session = %session.id(),
                turn = overflow.turn,
                step = overflow.step,
                "compaction (context overflow): shadowed {} surface nodes (~{} tokens); retrying",
                done.items,
                done.tokens
            );
            Ok(())
        }
        Ok(None) => Err("there is no earlier history to compact (the newest message alone is too long)".into()),
        Err(e) => Err(format!("compacting the history failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::deps;
    use super::*;
    use crate::model::script::{ReplayEntry, ScriptedModel};
    use crate::model::text_response;
    use crate::session::event::{AssistantMessage, ModelMessage, ToolResult};
    use crate::session::store::SessionStore;
    use crate::session::{Event, Kind, SessionHeader};

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": [{"type": "text", "text": text}]})
    }

    fn call(id: &str) -> Value {
        json!({"role": "assistant", "content": [{"type": "tool-call", "id": id, "name": "t", "arguments": "{}"}]})
    }

    fn result(id: &str) -> Value {
        json!({"role": "user", "content": [{"type": "tool-result", "toolCallId": id, "content": []}]})
    }

    #[test]
    fn selection_keeps_the_tail_and_never_splits_a_call_from_its_result() {
        let messages = [user("a"), call("1"), result("1"), user("b")];
        let tokens = [10, 10, 10, 10];
        let cuts = balanced_cuts(&messages);
        assert_eq!(cuts, [true, true, false, true, true]);
        // Retain 15: the walk stops at the result; the cut before it splits its call: snap
        // head-ward to before the call.
        assert_eq!(select(&cuts, &tokens, 15), Some(1));
        assert_eq!(select(&cuts, &tokens, 5), Some(3), "retain 0..=10 keeps only the newest");
        assert_eq!(select(&cuts, &tokens, 0), Some(3));
        assert_eq!(select(&cuts, &tokens, 35), None, "the kept tail would be everything");
        // The only pair and nothing before it: nothing can go.
        assert_eq!(select(&balanced_cuts(&[call("1"), result("1")]), &[10, 10], 0), None);
    }

    #[test]
    fn a_checkpoint_frames_the_summary_and_focus_extends_the_instruction() {
        let content = checkpoint(&[json!({"type": "text", "text": "S"})]);
        assert_eq!(content[0]["text"], format!("{PREAMBLE}\n\n<compacted-summary>"));
        assert_eq!(content[1]["text"], "S");
        assert_eq!(content[2]["text"], "</compacted-summary>");
        assert!(INSTRUCTION.starts_with("You are now acting as a compaction engine"));
        assert!(INSTRUCTION.ends_with("under the same structure.") && !INSTRUCTION.ends_with('\n'));
        assert_eq!(instruction(None), INSTRUCTION);
        assert_eq!(instruction(Some("  ")), INSTRUCTION);
        assert!(
            instruction(Some("the parser")).ends_with("\n\nThe user asked this checkpoint to focus on: the parser")
        );
    }

    /// A session with a long first exchange, a tool round and a last prompt.
    fn history(store: &SessionStore) -> Session {
        let mut session = store.create(SessionHeader::new("s", 0, None)).unwrap();
        let long = "x".repeat(2000);
        session.push(UserMessage::new(vec![json!({"type": "text", "text": long})], json!({"kind": "user"})));
        let calls = vec![json!({"type": "tool-call", "id": "c1", "name": "t", "arguments": "{}"})];
        let message = ModelMessage::new(calls, "test", "model");
        session.push(AssistantMessage { turn: 1, step: 1, message, usage: None });
        session.push(ToolResult::new(1, 1, "c1", vec![json!({"type": "text", "text": "r"})], None, None));
        session.push(UserMessage::new(vec![json!({"type": "text", "text": "last"})], json!({"kind": "user"})));
        session.flush().unwrap();
        session
    }

    async fn run(session: &mut Session, deps: &AgentDeps, focus: Option<&str>) -> Result<Option<Compacted>, String> {
        let cancel = CancellationToken::new();
        let request = Request { deps, tools: &[], turn: None, retain: 0, focus, cancel: &cancel };
        compact(session, request).await
    }

    fn after(events: &[Event], seq: u64) -> Vec<&str> {
        events.iter().filter(|e| e.seq >= seq).map(|e| e.kind.as_str()).collect()
    }

    #[tokio::test]
    async fn a_compaction_writes_dsh_s_transaction_and_the_next_history_is_checkpoint_then_tail() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = history(&store);
        let summaries = ["Summary.", "Merged."].map(|s| ReplayEntry::Chunks(text_response(&[s])));
        let model = Arc::new(ScriptedModel::new(summaries));
        let deps = deps(model.clone());
        let tail = session.messages()[3].clone();
        let done = run(&mut session, &deps, Some("tests")).await.unwrap().unwrap();
        assert_eq!((done.items, done.tokens), (3, 504 + 4 + (1 + 1 + 4 + 4) + (5 + 4 + 4)));
        let events = session.events();
        assert_eq!(after(events, 4), ["compact/start", "compact/summary", "user/message", "compact/end"]);
        assert_eq!(events[4].data, json!({"turn": null}));
        let summary = events[5].get::<CompactSummary>().unwrap();
        assert_eq!(summary.shadowed_seqs, [0, 1, 2]);
        assert_eq!(summary.shadowed_range, SeqRange { start: 0, end: 2 });
        assert_eq!(summary.summary, [json!({"type": "text", "text": "Summary."})]);
        assert_eq!(
            (summary.provider.as_str(), summary.model.as_str(), summary.max_tokens),
            ("test", "model", Some(8192))
        );
        assert!(summary.usage.is_some());
        assert_eq!(events[6].surface_op, Some(json!({"op": "replace", "start": 0, "end": 2})));
        assert_eq!(events[6].source_event_seqs, Some(vec![4, 5, 0, 1, 2]));
        assert_eq!(events[6].data["source"], json!({"kind": "plugin", "plugin": "compact"}));
        assert_eq!(events[7].data, json!({"turn": null}));
        let messages = session.messages();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0]["content"][1]["text"], "Summary.");
        assert_eq!(messages[1], tail);
        // The summary call: the shadowed messages, then the instruction; the session's header.
        let request = &model.requests()[0];
        assert_eq!(request.purpose, Purpose::Compaction);
        assert_eq!(request.max_tokens, Some(8192));
        assert_eq!(request.system, "sys");
        assert_eq!(request.messages.len(), 4);
        let instruction = request.messages[3]["content"][0]["text"].as_str().unwrap();
        assert!(instruction.starts_with(INSTRUCTION) && instruction.ends_with("focus on: tests"));
        assert_eq!(request.messages[3]["source"], json!({"kind": "plugin", "plugin": "dsh-compact-basic"}));
        // The transaction is written: a fresh load folds to the same history.
        drop(session);
        let loaded = store.load("s").unwrap();
        assert_eq!(loaded.messages(), messages);
        assert!(crate::session::surface::validate(loaded.events()).is_ok());
        // The next compaction starts at the head: the checkpoint is merged into the new one.
        let mut loaded = loaded;
        let text = |t: &str| UserMessage::new(vec![json!({"type": "text", "text": t})], json!({"kind": "user"}));
        loaded.push(text(&"z".repeat(2000)));
        let newest = loaded.push(text("newest"));
        let again = run(&mut loaded, &deps, None).await.unwrap().unwrap();
        assert_eq!(again.items, 3);
        let summary = loaded.events().iter().rev().find_map(|e| e.get::<CompactSummary>()).unwrap();
        assert_eq!(summary.shadowed_seqs, [6, 3, 8]);
        assert_eq!(summary.shadowed_range, SeqRange { start: 6, end: 8 });
        assert_eq!(loaded.surface_seqs()[1], newest);
    }

    #[tokio::test]
    async fn a_failed_summary_is_recorded_and_leaves_the_history_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = history(&store);
        let before = session.messages();
        let throw = ReplayEntry::Throw { chunks: vec![], message: "upstream down".into(), code: "X".into() };
        let long = "y".repeat(20_000);
        let entries = [throw, ReplayEntry::Chunks(text_response(&[""])), ReplayEntry::Chunks(text_response(&[&long]))];
        let deps = deps(Arc::new(ScriptedModel::new(entries)));
        let mut errors = Vec::new();
        for _ in 0..3 {
            errors.push(run(&mut session, &deps, None).await.unwrap_err());
        }
        assert_eq!(errors[0], "upstream down");
        assert_eq!(errors[1], "summarization produced no text summary content");
        assert!(errors[2].starts_with("summary is not smaller than the shadowed content ("), "{}", errors[2]);
        assert_eq!(session.messages(), before);
        let ends: Vec<_> = session.events().iter().filter_map(|e| e.get::<CompactEnd>()).collect();
        assert_eq!(ends.iter().map(|e| e.error.clone().unwrap()).collect::<Vec<_>>(), errors);
        assert!(!session.events().iter().any(|e| e.kind == Kind::CompactSummary));
    }

    #[tokio::test]
    async fn a_log_cut_at_any_point_of_a_compaction_loads_to_before_or_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = history(&store);
        let before = session.messages();
        let first = session.events().len();
        let deps = deps(Arc::new(ScriptedModel::new([ReplayEntry::Chunks(text_response(&["Summary."]))])));
        run(&mut session, &deps, None).await.unwrap().unwrap();
        let after = session.messages();
        let path = store.locate("s").unwrap().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        drop(session);
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        // Line 0 is the header; event n is line n + 1. Cut after each event of the transaction
        // and in the middle of each (a torn write).
        let mut cuts = Vec::new();
        for line in first + 1..lines.len() {
            let whole: String = lines[..line].concat();
            cuts.push(whole.clone());
            cuts.push(format!("{whole}{}", &lines[line][..lines[line].len() / 2]));
        }
        cuts.push(text.clone());
        let mut seen = (0, 0);
        for (n, cut) in cuts.iter().enumerate() {
            let copy = tempfile::tempdir().unwrap();
            let target = copy.path().join(path.strip_prefix(dir.path()).unwrap());
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(&target, cut).unwrap();
            let loaded = SessionStore::new(copy.path()).load("s").unwrap();
            let messages = loaded.messages();
            if messages == before {
                seen.0 += 1;
            } else {
                assert_eq!(messages, after, "cut {n} folds to a half state");
                seen.1 += 1;
            }
            assert!(crate::session::surface::validate(loaded.events()).is_ok(), "cut {n}");
        }
        assert!(seen.0 > 0 && seen.1 > 0, "{seen:?}");
    }

    /// Deps whose summariser has a `window`-token context and a 200-token output cap.
    fn small_summariser(model: Arc<ScriptedModel>, window: u64) -> AgentDeps {
        let mut deps = deps(model);
        let fallback = crate::model::capacity::ModelEntry { context_window: Some(window), price: None };
        let models = ModelTable { fallback, ..ModelTable::default() };
        deps.compaction = Policy { max_tokens: 200, models: Arc::new(models), ..Policy::default() };
        deps
    }

    /// A session of twelve 1,000-character prompts and a last one.
    fn twelve_prompts(store: &SessionStore) -> Session {
        let mut session = store.create(SessionHeader::new("s", 0, None)).unwrap();
        for i in 0..12 {
            let text = format!("{i}").repeat(1000);
            session.push(UserMessage::new(vec![json!({"type": "text", "text": text})], json!({"kind": "user"})));
        }
        session.push(UserMessage::new(vec![json!({"type": "text", "text": "last"})], json!({"kind": "user"})));
        session
    }

    #[tokio::test]
    async fn a_history_too_large_for_the_summariser_is_summarised_in_rounds_each_fitting_its_window() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = twelve_prompts(&store);
        let originals: u64 = session.messages()[..12].iter().map(message_tokens).sum();
        let summaries = ["One.", "Two.", "Three.", "Four."].map(|s| ReplayEntry::Chunks(text_response(&[s])));
        let model = Arc::new(ScriptedModel::new(summaries));
        let window = 3000;
        let deps = small_summariser(model.clone(), window);
        let done = run(&mut session, &deps, None).await.unwrap().unwrap();
        let requests = model.requests();
        assert!(requests.len() > 1, "one call could not hold it");
        for (n, request) in requests.iter().enumerate() {
            let sent = meter::header_tokens(&request.system, &request.tools)
                + request.messages.iter().map(message_tokens).sum::<u64>();
            assert!(sent + 200 <= window, "request {n}: {sent} estimated tokens and the output cap exceed {window}");
        }
        // Each round's range starts at the head: the previous checkpoint is merged.
        let first = requests[1].messages[0]["content"][1]["text"].as_str();
        assert_eq!(first, Some("One."));
        assert_eq!((done.items, done.tokens, done.unfinished), (12, originals, None));
        let messages = session.messages();
        assert_eq!(messages.len(), 2, "the whole range is summarised: checkpoint, then the newest");
        let last = requests.len() - 1;
        assert_eq!(messages[0]["content"][1]["text"], ["One.", "Two.", "Three.", "Four."][last]);
        assert_eq!(messages[1]["content"][0]["text"], "last");
        let summaries = session.events().iter().filter(|e| e.kind == Kind::CompactSummary).count();
        assert_eq!(summaries, requests.len());
        assert!(crate::session::surface::validate(session.events()).is_ok());
        drop(session);
        assert_eq!(store.load("s").unwrap().messages(), messages, "every round is written");
    }

    #[tokio::test]
    async fn the_summary_output_cap_is_at_most_a_quarter_of_the_summariser_window() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = history(&store);
        let model = Arc::new(ScriptedModel::new([ReplayEntry::Chunks(text_response(&["Summary."]))]));
        let mut deps = small_summariser(model.clone(), 3000);
        deps.compaction.max_tokens = 8192;
        run(&mut session, &deps, None).await.unwrap().unwrap();
        assert_eq!(model.requests()[0].max_tokens, Some(750));
        let summary = session.events().iter().find_map(|e| e.get::<CompactSummary>()).unwrap();
        assert_eq!(summary.max_tokens, Some(750));
    }

    /// A short exchange, then a call larger than the summariser's room: the first round takes the
    /// call (cut down) with the short head, and the compaction succeeds (the head alone was smaller
    /// than its summary, so every compaction of such a session failed and it stayed over its window).
    #[tokio::test]
    async fn a_short_head_before_a_huge_call_is_compacted_with_the_call_cut_down() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = store.create(SessionHeader::new("s", 0, None)).unwrap();
        let user = |text: &str| UserMessage::new(vec![json!({"type": "text", "text": text})], json!({"kind": "user"}));
        session.push(user("hi"));
        session.push(AssistantMessage {
            turn: 1,
            step: 1,
            message: ModelMessage::new(vec![json!({"type": "text", "text": "hello"})], "test", "model"),
            usage: None,
        });
        session.push(user("write the file"));
        let arguments = json!({"content": "z".repeat(60_000)}).to_string();
        let calls = vec![json!({"type": "tool-call", "id": "c1", "name": "write", "arguments": arguments})];
        session.push(AssistantMessage {
            turn: 2,
            step: 1,
            message: ModelMessage::new(calls, "test", "model"),
            usage: None,
        });
        session.push(ToolResult::new(2, 1, "c1", vec![json!({"type": "text", "text": "written"})], None, None));
        session.push(user("next"));
        // A summary longer than the short head ("hi", "hello", "write the file").
        let summary = "A summary of what happened so far, longer than the first three short messages were. ".repeat(4);
        let model = Arc::new(ScriptedModel::new([ReplayEntry::Chunks(text_response(&[summary.as_str()]))]));
        let mut deps = small_summariser(model.clone(), 20_000);
        deps.compaction.max_tokens = 8192;
        let done = run(&mut session, &deps, None).await.unwrap().unwrap();
        assert_eq!((done.items, done.unfinished.as_deref()), (5, None), "{done:?}");
        assert_eq!(model.requests().len(), 1);
        let messages = session.messages();
        assert_eq!(messages.len(), 2, "the checkpoint, then the newest message");
    }

    #[tokio::test]
    async fn a_round_that_fails_after_progress_keeps_the_progress_and_says_what_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = twelve_prompts(&store);
        let throw = ReplayEntry::Throw { chunks: vec![], message: "upstream down".into(), code: "X".into() };
        let entries = [ReplayEntry::Chunks(text_response(&["One."])), throw];
        let deps = small_summariser(Arc::new(ScriptedModel::new(entries)), 3000);
        let cancel = CancellationToken::new();
        let request = Request { deps: &deps, tools: &[], turn: None, retain: 0, focus: None, cancel: &cancel };
        let outcome = manual(&mut session, request).await;
        let Manual::Compacted(done) = &outcome else { panic!("{outcome:?}") };
        assert_eq!(done.unfinished.as_deref(), Some("upstream down"));
        assert!(done.items >= 2 && done.items < 12, "{done:?}");
        assert_eq!(session.messages().len(), 13 - done.items + 1, "the first round's checkpoint stands");
        let text = outcome.text();
        assert!(text.contains("not compacted (upstream down)") && text.contains("run /compact again"), "{text}");
    }

    #[tokio::test]
    async fn a_summariser_window_with_no_room_fails_the_compaction_with_why_and_leaves_the_history() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = twelve_prompts(&store);
        let before = session.messages();
        let model = Arc::new(ScriptedModel::new(Vec::<ReplayEntry>::new()));
        let deps = small_summariser(model.clone(), 600);
        let err = run(&mut session, &deps, None).await.unwrap_err();
        assert!(err.contains("does not fit the summariser's window"), "{err}");
        assert!(model.requests().is_empty(), "no call that the provider would refuse");
        assert_eq!(session.messages(), before);
        let end = session.events().iter().rev().find_map(|e| e.get::<CompactEnd>()).unwrap();
        assert_eq!(end.error.as_deref(), Some(err.as_str()), "the attempt is recorded");
    }

    async fn slash_compact(session: &mut Session, deps: &AgentDeps) -> Manual {
        let cancel = CancellationToken::new();
        manual(session, Request { deps, tools: &[], turn: None, retain: 0, focus: None, cancel: &cancel }).await
    }

    #[tokio::test]
    async fn slash_compact_on_a_log_that_cannot_be_written_says_so_and_claims_nothing_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = history(&store);
        let path = store.locate("s").unwrap().unwrap();
        let on_disk = crate::session::scan::scan_file(&path).unwrap().events.len();
        let throw = ReplayEntry::Throw { chunks: vec![], message: "upstream down".into(), code: "X".into() };
        let entries = [ReplayEntry::Chunks(text_response(&["Summary."])), throw];
        let deps = deps(Arc::new(ScriptedModel::new(entries)));
        super::super::tests::fill_disk_under(&path);

        // The replacement applies in memory; the answer says it is not saved.
        let outcome = slash_compact(&mut session, &deps).await;
        let Manual::Unsaved { done, cause } = &outcome else { panic!("{outcome:?}") };
        assert_eq!(done.items, 3);
        assert!(cause.contains("No space left on device"), "{cause}");
        assert_eq!(session.messages().len(), 2, "the session goes on from the checkpoint");
        let text = outcome.text();
        assert!(text.contains("in memory") && text.contains("could not be written"), "{text}");
        assert!(text.contains("No space left on device"), "{text}");
        assert!(!text.contains("unchanged") && !text.contains("recorded in the session log"), "{text}");

        // A failed attempt whose record cannot be written does not claim it is recorded.
        let compacted = session.messages();
        let outcome = slash_compact(&mut session, &deps).await;
        assert!(matches!(&outcome, Manual::Unrecorded { why, .. } if why == "upstream down"), "{outcome:?}");
        assert_eq!(session.messages(), compacted);
        let text = outcome.text();
        assert!(text.contains("upstream down") && text.contains("could not be written"), "{text}");
        assert!(!text.contains("recorded in the session log"), "{text}");

        // Neither reached the file.
        let events = crate::session::scan::scan_file(&path).unwrap().events;
        assert_eq!(events.len(), on_disk, "{:?}", events.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>());
    }
}
