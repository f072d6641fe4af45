//! The agent: one actor task per live session owning the `Session`, a FIFO inbox of turns, and
//! the handle the rest of kin talks to. `followup` queues a prompt as its own later turn;
//! `enqueue` does the same for a message from another session, durably (`intake`); `inject`
//! adds a message without running the model (between turns at once, or before the next step of
//! a running turn), durably too; `record` writes a setting's event durably and only then applies
//! the setting (between turns at once, during a turn at its next await point); `cancel` aborts
//! the running turn (and a user prompt or `/compact` still waiting for its turn) and `cancel_and_discard` also drops the queued inbox messages; `compact`
//! compacts the history between turns (`/compact`). A session loaded with inbox messages pending
//! starts held: they run once it is woken.

pub(crate) mod compact;
mod intake;
pub(crate) mod meter;
mod summary_input;
mod turn;

pub(crate) use intake::NotAccepted;

pub use intake::Restored;

pub(crate) use intake::{SETTLED_SOURCE, prepare};
pub use turn::completed_prefix;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use intake::{Arrival, Intake};

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::model::http::RetryPolicy;
use crate::model::{Model, ModelRoute};
use crate::permission::{PermissionPrompt, Permissions};
use crate::session::event::{SessionModel, TurnEndReason, UserMessage};
use crate::session::{EventBody, Session};
use crate::tools::ToolRegistry;
use crate::tools::files::FileAccess;

/// How a turn ended, as its caller hears it: the durable `turn/end` reason (`From`), or an
/// error the log could not record (a failed turn-end sync).
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEnd {
    Completed,
    MaxTokens,
    /// Cancelled by the user or a parent.
    Aborted,
    /// The agent was shut down before or during the turn.
    Disposed,
    /// The model used every step the turn allows (`agent.max_steps`) without a final answer.
    StepLimit(String),
    Error(String),
}

/// The failure code of a turn that ran out of steps.
pub(crate) const STEP_LIMIT: &str = "STEP_LIMIT";

impl From<&TurnEndReason> for TurnEnd {
    fn from(reason: &TurnEndReason) -> Self {
        match reason {
            TurnEndReason::Completed => TurnEnd::Completed,
            TurnEndReason::MaxTokens => TurnEnd::MaxTokens,
            TurnEndReason::Aborted => TurnEnd::Aborted,
            TurnEndReason::Disposed => TurnEnd::Disposed,
            TurnEndReason::Error { failure: Some(failure), .. } if failure.code == STEP_LIMIT => {
                TurnEnd::StepLimit(failure.message.clone())
            }
            TurnEndReason::Error { failure, .. } => {
                TurnEnd::Error(failure.as_ref().map_or_else(|| "the turn failed".into(), |f| f.message.clone()))
            }
            TurnEndReason::Interrupted => TurnEnd::Error("the turn was interrupted: kin stopped during it".into()),
            TurnEndReason::Unrecognized => TurnEnd::Error("the turn ended for a reason kin does not know".into()),
        }
    }
}

/// What every turn of one agent runs with.
#[derive(Clone)]
pub struct AgentDeps {
    pub model: Arc<dyn Model>,
    pub tools: ToolRegistry,
    pub route: ModelRoute,
    pub system: String,
    pub max_steps: u32,
    pub max_parallel_tools: usize,
    /// Runtime delegation depth (`subagentDepth`); the effective depth is the max with the header's.
    pub depth: u64,
    /// The permission gate in front of every tool call; `None` runs every call (children, tests).
    pub permissions: Option<Arc<Permissions>>,
    /// Asks the user when the gate says so; `None` rejects such calls.
    pub prompt: Option<Arc<dyn PermissionPrompt>>,
    /// Where the file tools read and write text (the editor); `None`: the disk.
    pub file_access: Option<Arc<dyn FileAccess>>,
    /// How a step retries a model call that completed with no content (`EMPTY_RESPONSE`),
    /// whatever the model: each attempt is a call of its own in the log.
    pub retry: RetryPolicy,
    /// How the session compacts its history.
    pub compaction: compact::Policy,
}

/// A message waiting for its own turn.
struct Queued {
    /// The prebuilt user message (its id was returned to the sender).
    message: UserMessage,
    /// Log-only events appended inside the turn, after the user message, before the first step.
    preamble: Vec<EventBody>,
    reply: Option<Reply>,
    /// An inbox message (its insertion is in the log): its turn starts with its claim.
    durable: bool,
    /// What the user typed, when the message is its expansion (a slash command): the session's
    /// fallback title takes these words.
    typed: Option<String>,
}

impl Queued {
    /// An inbox message whose insertion is in the log, with no one waiting for its turn.
    fn inbox(message: UserMessage) -> Self {
        Queued { message, preamble: Vec::new(), reply: None, durable: true, typed: None }
    }
}

/// The session's prompt slot, held from a user prompt's (or `/compact`'s) arrival until its turn
/// has ended: while it is held `prompt` answers `Busy`. Dropping it (the turn ended, or what held
/// it was dropped unanswered) frees the slot. Its token is the prompt's turn's cancellation from
/// the prompt's arrival on: a `session/cancel` before its turn starts (it waits behind another
/// turn, or has not reached the actor yet) ends that turn `aborted` before any model call.
pub(crate) struct PromptSlot {
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl Drop for PromptSlot {
    fn drop(&mut self) {
        if let Ok(mut held) = self.shared.prompt_cancel.lock() {
            *held = None;
        }
        self.shared.prompt.store(false, Ordering::SeqCst);
    }
}

/// Who hears how a turn ended; a user prompt's turn also holds the prompt slot, freed just before
/// the answer is sent (so whoever hears it may prompt again at once).
struct Reply {
    tx: oneshot::Sender<TurnEnd>,
    slot: Option<PromptSlot>,
}

impl Reply {
    fn send(self, end: TurnEnd) -> Result<(), TurnEnd> {
        drop(self.slot);
        self.tx.send(end)
    }
}

/// Why `prompt` queued nothing.
#[derive(Debug)]
pub enum PromptRefused {
    /// A user prompt (or `/compact`) of this session is in flight.
    Busy,
    Gone(AgentGone),
}

/// A read of the session, run on the actor between turns.
type Reader = Box<dyn FnOnce(&Session) + Send>;

/// The turns of restored messages, handed out once when the agent is woken.
type RestoredTurns = Vec<(String, oneshot::Receiver<TurnEnd>)>;

enum Command {
    Arrive(Arrival),
    Flush {
        reply: oneshot::Sender<Result<(), String>>,
    },
    Read(Reader),
    Log(EventBody),
    Wake {
        reply: oneshot::Sender<RestoredTurns>,
    },
    Discard {
        reply: oneshot::Sender<Result<usize, String>>,
    },
    /// `slot`: the prompt slot a `/compact` holds until it has answered.
    Compact {
        focus: Option<String>,
        reply: oneshot::Sender<compact::Manual>,
        slot: Option<PromptSlot>,
    },
    Shutdown {
        reply: oneshot::Sender<Result<(), String>>,
    },
}

/// What the handles and the actor share: the state the rest of kin asks the agent about.
struct Shared {
    current: Mutex<Option<CancellationToken>>,
    running: AtomicBool,
    /// Set by `shutdown`: a cancelled turn ends `disposed`, not `aborted`.
    disposing: AtomicBool,
    /// The prompt slot is held (`PromptSlot`).
    prompt: AtomicBool,
    /// The held prompt slot's token (`cancel` fires it too).
    prompt_cancel: Mutex<Option<CancellationToken>>,
    /// The route the next turn (or `/compact`) uses; a running turn keeps the one it started with.
    route: Mutex<ModelRoute>,
}

impl Shared {
    fn new(route: ModelRoute) -> Self {
        Shared {
            current: Mutex::default(),
            running: AtomicBool::new(false),
            disposing: AtomicBool::new(false),
            prompt: AtomicBool::new(false),
            prompt_cancel: Mutex::default(),
            route: Mutex::new(route),
        }
    }

    fn route(&self) -> ModelRoute {
        self.route.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// A cheap, clonable handle to a running agent.
#[derive(Clone)]
pub struct AgentHandle {
    id: String,
    tx: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
}

/// The agent has stopped and accepts nothing more.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentGone(pub String);

impl std::fmt::Display for AgentGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "agent {} has shut down", self.0)
    }
}

impl std::error::Error for AgentGone {}

impl AgentHandle {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// True while a turn runs.
    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::SeqCst)
    }

    /// True while a user prompt (or `/compact`) of this session is in flight: from `prompt` until
    /// its turn has ended.
    pub(crate) fn is_busy(&self) -> bool {
        self.shared.prompt.load(Ordering::SeqCst)
    }

    /// The route the session's next turn uses (the last `set_route`, even while a turn still runs
    /// on the one before).
    pub fn route(&self) -> ModelRoute {
        self.shared.route()
    }

    /// Takes the prompt slot, unless it is held.
    fn claim(&self) -> Option<PromptSlot> {
        if self.shared.prompt.swap(true, Ordering::SeqCst) {
            return None;
        }
        let cancel = CancellationToken::new();
        if let Ok(mut held) = self.shared.prompt_cancel.lock() {
            *held = Some(cancel.clone());
        }
        Some(PromptSlot { shared: self.shared.clone(), cancel })
    }

    /// A user prompt: `followup`, one at a time per session. `Busy` while another prompt (or
    /// `/compact`) is in flight; the slot is free again once the turn's end is answered.
    pub fn prompt(&self, content: Vec<Value>, source: Value) -> Result<oneshot::Receiver<TurnEnd>, PromptRefused> {
        self.prompt_typed(content, source, None)
    }

    /// `prompt`, for `content` that expands what the user `typed` (a slash command): the
    /// session's fallback title is made of their words, not of the expansion.
    pub fn prompt_typed(
        &self,
        content: Vec<Value>,
        source: Value,
        typed: Option<String>,
    ) -> Result<oneshot::Receiver<TurnEnd>, PromptRefused> {
        let slot = self.claim().ok_or(PromptRefused::Busy)?;
        self.queue_turn(content, source, Vec::new(), Some(slot), typed).map_err(PromptRefused::Gone)
    }

    /// Queues a prompt (`content`) as the sole message of its own FIFO turn; the receiver
    /// resolves when that turn has ended and its log is flushed. A prompt is not an inbox
    /// message: nothing is written until its turn starts.
    pub fn followup(&self, content: Vec<Value>, source: Value) -> Result<oneshot::Receiver<TurnEnd>, AgentGone> {
        self.followup_with(content, source, Vec::new())
    }

    /// `followup` whose turn also records `preamble` (log-only events) right after the user
    /// message, before the first model request.
    pub fn followup_with(
        &self,
        content: Vec<Value>,
        source: Value,
        preamble: Vec<EventBody>,
    ) -> Result<oneshot::Receiver<TurnEnd>, AgentGone> {
        self.queue_turn(content, source, preamble, None, None)
    }

    fn queue_turn(
        &self,
        content: Vec<Value>,
        source: Value,
        preamble: Vec<EventBody>,
        slot: Option<PromptSlot>,
        typed: Option<String>,
    ) -> Result<oneshot::Receiver<TurnEnd>, AgentGone> {
        let (tx, rx) = oneshot::channel();
        let reply = Some(Reply { tx, slot });
        let queued = Queued { message: UserMessage::new(content, source), preamble, reply, durable: false, typed };
        self.send(Command::Arrive(Arrival::Turn { queued, accepted: None }))?;
        Ok(rx)
    }

    /// Queues a message from another session as its own FIFO turn, durably: returns the
    /// message id once its insertion is in the log and `fsync`ed, and a receiver that resolves
    /// when its turn has ended. Refused (nothing kept) when the log cannot be written.
    pub async fn enqueue(
        &self,
        content: Vec<Value>,
        source: Value,
    ) -> Result<(String, oneshot::Receiver<TurnEnd>), NotAccepted> {
        let (tx, rx) = oneshot::channel();
        let message = UserMessage::new(content, source);
        let id = message.id.clone();
        let queued =
            Queued { message, preamble: Vec::new(), reply: Some(Reply { tx, slot: None }), durable: true, typed: None };
        let (accepted, written) = oneshot::channel();
        self.arrive(Arrival::Turn { queued, accepted: Some(accepted) }, written).await?;
        Ok((id, rx))
    }

    /// Adds a message from another session without running the model, durably: between turns
    /// it is appended to the history at once; during a turn it is staged (and written as a
    /// `next-step` insertion) for the turn's next step. Returns the message id once it is in the
    /// log and `fsync`ed.
    pub async fn inject(&self, content: Vec<Value>, source: Value) -> Result<String, NotAccepted> {
        let message = UserMessage::new(content, source);
        let id = message.id.clone();
        let (accepted, written) = oneshot::channel();
        self.arrive(Arrival::Step { message, accepted, wake: false }, written).await?;
        Ok(id)
    }

    /// `inject`, for a message the agent must act on (dsh's `steer`): during a turn it is
    /// staged for the next step, and if the turn ends before a step takes it, it is queued for a
    /// turn of its own; between turns it is queued for one at once. Returns the message id once
    /// it is in the log and `fsync`ed.
    pub async fn steer(&self, content: Vec<Value>, source: Value) -> Result<String, NotAccepted> {
        let message = UserMessage::new(content, source);
        let id = message.id.clone();
        let (accepted, written) = oneshot::channel();
        self.arrive(Arrival::Step { message, accepted, wake: true }, written).await?;
        Ok(id)
    }

    async fn arrive(
        &self,
        arrival: Arrival,
        written: oneshot::Receiver<Result<(), String>>,
    ) -> Result<(), NotAccepted> {
        self.send(Command::Arrive(arrival)).map_err(|_| NotAccepted::Gone(self.id.clone()))?;
        match written.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(cause)) => Err(NotAccepted::Unwritten { session: self.id.clone(), cause }),
            Err(_) => Err(NotAccepted::Gone(self.id.clone())),
        }
    }

    /// Starts the turns of the inbox messages a loaded session was restored with (they run
    /// before anything queued later) and returns them: `(message id, turn end)`, once (later
    /// calls get none). A session restored with nothing pending is never held.
    pub async fn wake(&self) -> Result<RestoredTurns, AgentGone> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Wake { reply })?;
        rx.await.map_err(|_| AgentGone(self.id.clone()))
    }

    /// Cancels the running turn, if any, and discards the queued inbox messages before another
    /// turn can start (the actor does both, so no turn end can let the next message in
    /// between): one durable `canceled` splice; their turns answer `Aborted`. Returns how many
    /// there were.
    pub async fn cancel_and_discard(&self) -> Result<usize, String> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Discard { reply }).map_err(|e| e.to_string())?;
        rx.await.map_err(|_| AgentGone(self.id.clone()).to_string())?
    }

    /// Runs `f` on the session between turns (waiting for a running turn to end).
    pub async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Session) -> R + Send + 'static,
    ) -> Result<R, AgentGone> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Read(Box::new(move |s: &Session| {
            let _ = tx.send(f(s));
        })))?;
        rx.await.map_err(|_| AgentGone(self.id.clone()))
    }

    /// Switches the model route from the next turn on (a running turn keeps its route).
    pub fn set_route(&self, route: ModelRoute) -> Result<(), AgentGone> {
        if self.is_gone() {
            return Err(AgentGone(self.id.clone()));
        }
        *self.shared.route.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = route;
        Ok(())
    }

    /// Records a log-only event between turns (after the running turn, if any), without telling
    /// anyone whether it was written (a title, the MCP servers): when the log cannot be written
    /// it stays queued and the writer retries.
    pub fn inject_log(&self, body: impl Into<EventBody>) -> Result<(), AgentGone> {
        self.send(Command::Log(body.into()))
    }

    /// Records a setting: its log-only event (`body`) is written and `fsync`ed, then `apply` runs
    /// on the actor (so settings take effect in the order of their events) and the returned
    /// future resolves. The event is handed over now, before the future is polled; it is written
    /// between turns at once, and during a turn at the turn's next await point (a model stream,
    /// the tools, a retry's wait), not after the turn; only a compaction's summary call (`/compact`,
    /// or one at a step's start) holds it until it ends. When the log cannot be written nothing
    /// is kept, `apply` never runs and the cause is returned; `Gone` when the agent stopped first.
    pub(crate) fn record(
        &self,
        body: impl Into<EventBody>,
        apply: impl FnOnce() + Send + 'static,
    ) -> BoxFuture<'static, Result<(), NotAccepted>> {
        let (recorded, written) = oneshot::channel();
        let arrival = Arrival::Log { body: body.into(), apply: Box::new(apply), recorded };
        let sent = self.send(Command::Arrive(arrival));
        let id = self.id.clone();
        Box::pin(async move {
            if sent.is_err() {
                return Err(NotAccepted::Gone(id));
            }
            match written.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(cause)) => Err(NotAccepted::Unwritten { session: id, cause }),
                Err(_) => Err(NotAccepted::Gone(id)),
            }
        })
    }

    /// `record` of a model switch (`session/model`): the route of the next turn changes once the
    /// event is on disk (a running turn keeps its route).
    pub(crate) fn record_route(&self, route: ModelRoute) -> BoxFuture<'static, Result<(), NotAccepted>> {
        let body = SessionModel { provider: route.provider.clone(), model: route.model.clone() };
        let shared = self.shared.clone();
        self.record(body, move || {
            *shared.route.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = route;
        })
    }

    /// Cancels the running turn, if any, and the user prompt in flight, if any, even one still
    /// waiting for its turn (it then ends `aborted` without a model call); other queued turns
    /// stay queued.
    pub fn cancel(&self) {
        if let Ok(current) = self.shared.current.lock()
            && let Some(token) = current.as_ref()
        {
            token.cancel();
        }
        if let Ok(prompt) = self.shared.prompt_cancel.lock()
            && let Some(token) = prompt.as_ref()
        {
            token.cancel();
        }
    }

    /// `/compact`: compacts the history now, between turns (`focus`: what the summary should
    /// keep). Busy while a turn runs or a message waits for one; prompts sent meanwhile queue
    /// behind it.
    pub async fn compact(&self, focus: Option<String>) -> Result<compact::Manual, AgentGone> {
        self.compact_holding(focus, None).await
    }

    /// `/compact` as a user prompt: `None` (busy, nothing sent) while a turn runs or another prompt
    /// is in flight; else `compact`, holding the prompt slot until it has answered.
    pub(crate) fn compact_prompt(
        &self,
        focus: Option<String>,
    ) -> Option<impl std::future::Future<Output = Result<compact::Manual, AgentGone>> + Send + 'static> {
        if self.is_running() {
            return None;
        }
        let slot = self.claim()?;
        let handle = self.clone();
        Some(async move { handle.compact_holding(focus, Some(slot)).await })
    }

    async fn compact_holding(
        &self,
        focus: Option<String>,
        slot: Option<PromptSlot>,
    ) -> Result<compact::Manual, AgentGone> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Compact { focus, reply, slot })?;
        rx.await.map_err(|_| AgentGone(self.id.clone()))
    }

    /// Makes everything appended so far durable.
    pub async fn flush(&self) -> Result<(), String> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Flush { reply }).map_err(|e| e.to_string())?;
        rx.await.map_err(|_| AgentGone(self.id.clone()).to_string())?
    }

    /// Cancels the running turn, answers queued turns `Disposed` (their inbox messages stay
    /// pending in the log), flushes and stops the actor.
    pub async fn shutdown(&self) {
        if let Err(e) = self.dispose().await {
            tracing::warn!(session = %self.id, "shutdown: {e}");
        }
    }

    /// `shutdown`, with the cause when the log's final flush failed (the agent is stopped
    /// either way). An agent that was already gone disposes cleanly.
    pub async fn dispose(&self) -> Result<(), String> {
        self.stop();
        let (reply, rx) = oneshot::channel();
        if self.send(Command::Shutdown { reply }).is_err() {
            return Ok(());
        }
        rx.await.unwrap_or(Ok(()))
    }

    /// The first half of `shutdown`: the running turn is cancelled (it ends `disposed`) and no
    /// queued turn starts any more, so what is queued stays pending in the log. Stopping every
    /// agent of a tree first and shutting them down afterwards (child-first) keeps a parent from
    /// starting its next turn while its children wind down.
    pub fn stop(&self) {
        self.shared.disposing.store(true, Ordering::SeqCst);
        self.cancel();
    }

    /// True once the actor has stopped: it accepts nothing more.
    pub fn is_gone(&self) -> bool {
        self.tx.is_closed()
    }

    fn send(&self, command: Command) -> Result<(), AgentGone> {
        self.tx.send(command).map_err(|_| AgentGone(self.id.clone()))
    }
}

/// Starts the actor for a session with nothing pending (a new one) and returns its handle.
pub fn spawn_agent(session: Session, deps: AgentDeps) -> AgentHandle {
    spawn_restored(session, Restored::none(), deps)
}

/// Starts the actor for a loaded session with what `prepare` restored: its pending messages wait
/// (held) until `wake`, or until something else is queued behind them.
pub(crate) fn spawn_restored(session: Session, restored: Restored, deps: AgentDeps) -> AgentHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared::new(deps.route.clone()));
    let handle = AgentHandle { id: session.id().to_string(), tx, shared: shared.clone() };
    let mut queue = VecDeque::new();
    let mut turns = Vec::new();
    for message in restored.next_turn {
        let (tx, rx) = oneshot::channel();
        turns.push((message.id.clone(), rx));
        queue.push_back(Queued {
            message,
            preamble: Vec::new(),
            reply: Some(Reply { tx, slot: None }),
            durable: true,
            typed: None,
        });
    }
    let held = !queue.is_empty();
    let actor = Actor { session, deps, shared, intake: Intake::with_queue(queue), held, restored: Some(turns) };
    tokio::spawn(actor.run(rx));
    handle
}

struct Actor {
    session: Session,
    deps: AgentDeps,
    shared: Arc<Shared>,
    intake: Intake,
    /// Restored turns wait for `wake` (or for a later message).
    held: bool,
    restored: Option<RestoredTurns>,
}

/// What a running turn defers to its end.
#[derive(Default)]
struct Deferred {
    flushes: Vec<oneshot::Sender<Result<(), String>>>,
    readers: Vec<Reader>,
    logs: Vec<EventBody>,
    wakes: Vec<oneshot::Sender<RestoredTurns>>,
    discards: Vec<oneshot::Sender<Result<usize, String>>>,
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        let mut shutdown: Option<oneshot::Sender<Result<(), String>>> = None;
        loop {
            if shutdown.is_some() {
                break;
            }
            // A stopping agent starts no queued turn: it stays pending in the log.
            let stopping = self.shared.disposing.load(Ordering::SeqCst);
            let next = if self.held || stopping { None } else { self.intake.next() };
            let Some(item) = next else {
                match rx.recv().await {
                    Some(command) => self.idle_command(command, &mut shutdown).await,
                    None => break,
                }
                continue;
            };
            let end = self.turn(item, &mut rx, &mut shutdown).await;
            tracing::debug!(session = %self.session.id(), ?end, "turn ended");
        }
        // Nothing sent from here on is taken (the sender hears the agent is gone): a command
        // that slipped in between the shutdown reply and the end of this task was accepted and
        // then dropped with the channel.
        rx.close();
        // Queued inbox messages stay pending in the log: a later load runs them.
        self.intake.close();
        let flushed = self
            .session
            .flush()
            .map_err(|e| format!("the session {} stops with events it could not write: {e:#}", self.session.id()));
        if let Err(e) = &flushed {
            tracing::error!(session = %self.session.id(), "{e}");
        }
        // Close the log (releasing its lock) before anyone hears the agent is gone.
        drop(self);
        if let Some(reply) = shutdown {
            let _ = reply.send(flushed);
        }
    }

    async fn idle_command(&mut self, command: Command, shutdown: &mut Option<oneshot::Sender<Result<(), String>>>) {
        match command {
            Command::Arrive(arrival) => {
                if matches!(arrival, Arrival::Turn { .. } | Arrival::Step { wake: true, .. }) {
                    self.held = false;
                }
                self.intake.arrive(arrival);
                self.intake.accept(&mut self.session, false);
            }
            Command::Flush { reply } => {
                let _ = reply.send(self.session.flush().map_err(|e| format!("{e:#}")));
            }
            Command::Read(reader) => reader(&self.session),
            Command::Log(body) => log_durably(&mut self.session, vec![body]),
            Command::Wake { reply } => self.wake(reply),
            Command::Discard { reply } => {
                let _ = reply.send(self.intake.discard(&mut self.session));
            }
            Command::Compact { focus, reply, slot } => {
                let cancel = slot.as_ref().map_or_else(CancellationToken::new, |slot| slot.cancel.clone());
                let outcome = self.compact_now(focus.as_deref(), cancel).await;
                drop(slot);
                let _ = reply.send(outcome);
            }
            Command::Shutdown { reply } => *shutdown = Some(reply),
        }
    }

    /// `/compact` between turns (dsh's `compactNow`): busy when a message waits for its turn;
    /// `session/cancel` cancels it (its token is the running one meanwhile).
    /// `cancel`: the `/compact` prompt's own token (its slot's), which a cancel may have fired
    /// before it got here: then nothing is written.
    async fn compact_now(&mut self, focus: Option<&str>, cancel: CancellationToken) -> compact::Manual {
        if self.intake.has_queued() || self.shared.disposing.load(Ordering::SeqCst) {
            return compact::Manual::Busy;
        }
        if cancel.is_cancelled() {
            return compact::Manual::Cancelled;
        }
        self.deps.route = self.shared.route();
        if let Ok(mut current) = self.shared.current.lock() {
            *current = Some(cancel.clone());
        }
        let tools = self.deps.tools.snapshot(&cancel).await.schemas();
        let request =
            compact::Request { deps: &self.deps, tools: &tools, turn: None, retain: 0, focus, cancel: &cancel };
        let outcome = compact::manual(&mut self.session, request).await;
        if let Ok(mut current) = self.shared.current.lock() {
            *current = None;
        }
        outcome
    }

    fn wake(&mut self, reply: oneshot::Sender<RestoredTurns>) {
        self.held = false;
        let _ = reply.send(self.restored.take().unwrap_or_default());
    }

    /// Runs one turn while still accepting commands (`During::handle`); the commands sent
    /// before it ended are all handled before it returns.
    async fn turn(
        &mut self,
        item: Queued,
        rx: &mut mpsc::UnboundedReceiver<Command>,
        shutdown: &mut Option<oneshot::Sender<Result<(), String>>>,
    ) -> TurnEnd {
        // A user prompt's turn runs under its slot's token, which a cancel may have fired already.
        let slot = item.reply.as_ref().and_then(|reply| reply.slot.as_ref());
        let cancel = slot.map_or_else(CancellationToken::new, |slot| slot.cancel.clone());
        if let Ok(mut current) = self.shared.current.lock() {
            *current = Some(cancel.clone());
        }
        self.shared.running.store(true, Ordering::SeqCst);
        // A route chosen since the last turn applies from this one.
        self.deps.route = self.shared.route();
        let log_before = self.session.log_bytes();
        let Queued { message, preamble, reply, durable, typed } = item;
        let mut deferred = Deferred::default();
        let mut end = {
            let input = turn::TurnInput { message, preamble, claim: durable, typed };
            let run = turn::run_turn(
                &mut self.session,
                &self.deps,
                input,
                cancel.clone(),
                &self.intake,
                &self.shared.disposing,
            );
            tokio::pin!(run);
            let during = During { intake: &self.intake, disposing: &self.shared.disposing, cancel: &cancel };
            let end = loop {
                tokio::select! {
                    end = &mut run => break end,
                    command = rx.recv() => during.handle(command, &mut deferred, shutdown),
                }
            };
            // What was sent before the turn ended is handled before the next one can start: a
            // discard that raced the turn's end must not let the next queued message in.
            while let Ok(command) = rx.try_recv() {
                during.handle(Some(command), &mut deferred, shutdown);
            }
            end
        };
        // Step messages that arrived too late for a step land between turns.
        self.intake.land_staged(&mut self.session, true);
        self.intake.accept(&mut self.session, false);
        if !deferred.logs.is_empty() {
            log_durably(&mut self.session, deferred.logs);
        }
        let flushed = self.session.flush().map_err(|e| format!("{e:#}"));
        // The turn's buffers (its stream, its messages' lines) are gone by now, or with the
        // updates still on their way to the client.
        if self.session.log_bytes().saturating_sub(log_before) > crate::heap::RELEASE_AFTER_BYTES {
            crate::outflow::outflow().release_when_drained();
        }
        if let Err(e) = &flushed
            && !matches!(end, TurnEnd::Error(_))
        {
            end = TurnEnd::Error(format!("could not persist the session log: {e}"));
        }
        for reply in deferred.flushes {
            let _ = reply.send(flushed.clone());
        }
        for reader in deferred.readers {
            reader(&self.session);
        }
        for reply in deferred.discards {
            let _ = reply.send(self.intake.discard(&mut self.session));
        }
        for reply in deferred.wakes {
            self.wake(reply);
        }
        if let Ok(mut current) = self.shared.current.lock() {
            *current = None;
        }
        self.shared.running.store(false, Ordering::SeqCst);
        if let Some(reply) = reply {
            let _ = reply.send(end.clone());
        }
        end
    }
}

/// Records log-only events (a title, a model switch) so that observers (the editor, whose next
/// `session/list` reads the disk) see them only once they are written and synced. When the log
/// cannot be written they are kept pending instead (the writer warns and retries).
fn log_durably(session: &mut Session, bodies: Vec<EventBody>) {
    if let Err(e) = session.push_durably(bodies.clone()) {
        tracing::debug!(session = %session.id(), "log events kept pending: {e}");
        for body in bodies {
            session.push(body);
        }
    }
}

/// What a command may touch while a turn runs (the turn holds the session).
struct During<'a> {
    intake: &'a Intake,
    disposing: &'a AtomicBool,
    cancel: &'a CancellationToken,
}

impl During<'_> {
    /// Handles a command sent during a turn (`None`: every handle is gone): messages arrive
    /// (the turn writes them at its await points); flushes, reads, wakes and log events wait
    /// for the turn's end; a discard cancels the turn and drops the queue at its end; shutdown
    /// cancels the turn.
    fn handle(
        &self,
        command: Option<Command>,
        deferred: &mut Deferred,
        shutdown: &mut Option<oneshot::Sender<Result<(), String>>>,
    ) {
        match command {
            Some(Command::Arrive(arrival)) => self.intake.arrive(arrival),
            Some(Command::Flush { reply }) => deferred.flushes.push(reply),
            Some(Command::Read(reader)) => deferred.readers.push(reader),
            Some(Command::Log(body)) => deferred.logs.push(body),
            Some(Command::Wake { reply }) => deferred.wakes.push(reply),
            Some(Command::Compact { reply, .. }) => {
                let _ = reply.send(compact::Manual::Busy);
            }
            Some(Command::Discard { reply }) => {
                self.cancel.cancel();
                deferred.discards.push(reply);
            }
            Some(Command::Shutdown { reply }) => {
                self.disposing.store(true, Ordering::SeqCst);
                self.cancel.cancel();
                *shutdown = Some(reply);
            }
            None => {
                self.disposing.store(true, Ordering::SeqCst);
                self.cancel.cancel();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::model::script::{ReplayEntry, ScriptedModel};
    use crate::session::event::SessionMode;
    use crate::session::store::SessionStore;
    use crate::session::{Kind, SessionHeader};

    /// Points every descriptor this process holds on `path` at `/dev/full`, whose writes fail
    /// with ENOSPC as a full disk's do: the log can no longer be written (the file keeps what
    /// it had).
    pub(super) fn fill_disk_under(path: &std::path::Path) {
        use std::os::fd::AsRawFd;
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let target = std::fs::canonicalize(path).unwrap();
        let mut pointed = 0;
        for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            if std::fs::read_link(entry.path()).is_ok_and(|link| link == target) {
                let fd: i32 = entry.file_name().to_string_lossy().parse().unwrap();
                // SAFETY: both descriptors are open in this process; dup2 only repoints `fd`.
                assert!(unsafe { libc::dup2(full.as_raw_fd(), fd) } >= 0);
                pointed += 1;
            }
        }
        assert!(pointed > 0, "no descriptor is open on {}", path.display());
    }

    /// An agent's dependencies for a test: `model`, no tools, no gate.
    pub(super) fn deps(model: Arc<ScriptedModel>) -> AgentDeps {
        AgentDeps {
            model,
            tools: ToolRegistry::new(),
            route: ModelRoute::parse("test/model").unwrap(),
            system: "sys".into(),
            max_steps: 5,
            max_parallel_tools: 1,
            depth: 0,
            permissions: None,
            prompt: None,
            file_access: None,
            retry: Default::default(),
            compaction: compact::Policy::default(),
        }
    }

    #[tokio::test]
    async fn a_setting_applies_once_on_disk_and_not_at_all_when_the_log_cannot_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = SessionStore::new(dir.path());
        let mut session = store.create(SessionHeader::new("s", 0, None)).unwrap();
        session.flush().unwrap();
        let path = store.locate("s").unwrap().unwrap();
        let handle = spawn_agent(session, deps(Arc::new(ScriptedModel::new(Vec::<ReplayEntry>::new()))));
        let applied = Arc::new(AtomicUsize::new(0));
        let count = || {
            let applied = applied.clone();
            move || {
                applied.fetch_add(1, Ordering::SeqCst);
            }
        };
        let modes_on_disk = || {
            let events = crate::session::scan::scan_file(&path).unwrap().events;
            events.iter().filter(|e| e.kind == Kind::SessionMode).count()
        };

        // Resolved once written and synced, and applied by then.
        handle.record(SessionMode { mode: "ask".into() }, count()).await.unwrap();
        assert_eq!(applied.load(Ordering::SeqCst), 1);
        assert_eq!(modes_on_disk(), 1);

        // A log that cannot be written: refused with the cause, not applied, nothing kept.
        fill_disk_under(&path);
        let refused = handle.record(SessionMode { mode: "read-only".into() }, count()).await.unwrap_err();
        assert!(
            matches!(&refused, NotAccepted::Unwritten { cause, .. } if cause.contains("No space left on device")),
            "{refused}"
        );
        assert_eq!(applied.load(Ordering::SeqCst), 1, "the setting is not applied");
        let route = handle.route();
        let refused = handle.record_route(ModelRoute::parse("other/model").unwrap()).await;
        assert!(matches!(refused, Err(NotAccepted::Unwritten { .. })), "{refused:?}");
        assert_eq!(handle.route(), route, "the route is unchanged");
        assert_eq!(modes_on_disk(), 1);
        // Nothing of the refused settings waits to be written: the agent stops cleanly.
        assert_eq!(handle.dispose().await, Ok(()));
    }
}
