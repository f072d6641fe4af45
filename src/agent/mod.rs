//! The agent: one actor task per live session owning the `Session`, a FIFO inbox of turns, and
//! the handle the rest of kin talks to. `followup` queues a message as its own later turn;
//! `inject` adds a user message without running the model (between turns at once, or before the
//! next step of a running turn); `cancel` aborts the running turn.

mod turn;

pub use turn::completed_prefix;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::model::http::RetryPolicy;
use crate::model::{Model, ModelRoute};
use crate::permission::{PermissionPrompt, Permissions};
use crate::session::event::{TurnEndReason, UserMessage};
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
pub const STEP_LIMIT: &str = "STEP_LIMIT";

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
}

/// A message waiting for its own turn.
struct Queued {
    /// The prebuilt user message (its id was returned to the sender).
    message: UserMessage,
    /// Log-only events appended inside the turn, after the user message, before the first step.
    preamble: Vec<EventBody>,
    reply: Option<oneshot::Sender<TurnEnd>>,
}

/// A read of the session, run on the actor between turns.
type Reader = Box<dyn FnOnce(&Session) + Send>;

/// Messages staged for the next step of the running turn.
type Staged = Arc<Mutex<Vec<UserMessage>>>;

enum Command {
    Followup(Queued),
    Inject { message: UserMessage },
    Flush { reply: oneshot::Sender<Result<(), String>> },
    Read(Reader),
    SetRoute(crate::model::ModelRoute),
    Log(EventBody),
    Shutdown { reply: oneshot::Sender<()> },
}

#[derive(Default)]
struct Shared {
    current: Mutex<Option<CancellationToken>>,
    running: AtomicBool,
    /// Set by `shutdown`: a cancelled turn ends `disposed`, not `aborted`.
    disposing: AtomicBool,
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

    /// Queues `content` as the sole message of its own FIFO turn; the receiver resolves when
    /// that turn has ended and its log is flushed.
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
        self.submit(content, source, preamble).map(|(_, rx)| rx)
    }

    /// `followup_with` that also returns the accepted message's id.
    pub fn submit(
        &self,
        content: Vec<Value>,
        source: Value,
        preamble: Vec<EventBody>,
    ) -> Result<(String, oneshot::Receiver<TurnEnd>), AgentGone> {
        let (reply, rx) = oneshot::channel();
        let message = UserMessage::new(content, source);
        let id = message.id.clone();
        self.send(Command::Followup(Queued { message, preamble, reply: Some(reply) }))?;
        Ok((id, rx))
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
    pub fn set_route(&self, route: crate::model::ModelRoute) -> Result<(), AgentGone> {
        self.send(Command::SetRoute(route))
    }

    /// Records a log-only event between turns (after the running turn, if any).
    pub fn inject_log(&self, body: impl Into<EventBody>) -> Result<(), AgentGone> {
        self.send(Command::Log(body.into()))
    }

    /// Adds a user message without running the model (between turns at once, or before the
    /// next step of a running turn); returns the message id.
    pub fn inject(&self, content: Vec<Value>, source: Value) -> Result<String, AgentGone> {
        let message = UserMessage::new(content, source);
        let id = message.id.clone();
        self.send(Command::Inject { message })?;
        Ok(id)
    }

    /// Cancels the running turn, if any; queued turns stay queued.
    pub fn cancel(&self) {
        if let Ok(current) = self.shared.current.lock()
            && let Some(token) = current.as_ref()
        {
            token.cancel();
        }
    }

    /// Makes everything appended so far durable.
    pub async fn flush(&self) -> Result<(), String> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Flush { reply }).map_err(|e| e.to_string())?;
        rx.await.map_err(|_| AgentGone(self.id.clone()).to_string())?
    }

    /// Cancels the running turn, answers queued turns `Disposed`, flushes and stops the actor.
    pub async fn shutdown(&self) {
        self.shared.disposing.store(true, Ordering::SeqCst);
        self.cancel();
        let (reply, rx) = oneshot::channel();
        if self.send(Command::Shutdown { reply }).is_ok() {
            let _ = rx.await;
        }
    }

    fn send(&self, command: Command) -> Result<(), AgentGone> {
        self.tx.send(command).map_err(|_| AgentGone(self.id.clone()))
    }
}

/// Starts the actor for `session` and returns its handle.
pub fn spawn_agent(session: Session, deps: AgentDeps) -> AgentHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared::default());
    let handle = AgentHandle { id: session.id().to_string(), tx, shared: shared.clone() };
    tokio::spawn(Actor { session, deps, shared, queue: VecDeque::new(), staged: Staged::default() }.run(rx));
    handle
}

struct Actor {
    session: Session,
    deps: AgentDeps,
    shared: Arc<Shared>,
    queue: VecDeque<Queued>,
    staged: Staged,
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        let mut shutdown: Option<oneshot::Sender<()>> = None;
        loop {
            if shutdown.is_some() {
                break;
            }
            let Some(item) = self.queue.pop_front() else {
                match rx.recv().await {
                    Some(command) => self.idle_command(command, &mut shutdown),
                    None => break,
                }
                continue;
            };
            let end = self.turn(item, &mut rx, &mut shutdown).await;
            tracing::debug!(session = %self.session.id(), ?end, "turn ended");
        }
        for queued in self.queue.drain(..) {
            if let Some(reply) = queued.reply {
                let _ = reply.send(TurnEnd::Disposed);
            }
        }
        if let Err(e) = self.session.flush() {
            tracing::error!(session = %self.session.id(), "final flush failed: {e:#}");
        }
        // Close the log (releasing its lock) before anyone hears the agent is gone.
        drop(self);
        if let Some(reply) = shutdown {
            let _ = reply.send(());
        }
    }

    fn idle_command(&mut self, command: Command, shutdown: &mut Option<oneshot::Sender<()>>) {
        match command {
            Command::Followup(queued) => self.queue.push_back(queued),
            Command::Inject { message } => {
                // An accepted message between turns is made durable at once.
                self.session.push(message);
                if let Err(e) = self.session.flush() {
                    tracing::error!(session = %self.session.id(), "flush after an injected message failed: {e:#}");
                }
            }
            Command::Flush { reply } => {
                let _ = reply.send(self.session.flush().map_err(|e| format!("{e:#}")));
            }
            Command::Read(reader) => reader(&self.session),
            Command::SetRoute(route) => self.deps.route = route,
            Command::Log(body) => {
                self.session.push(body);
                if let Err(e) = self.session.flush() {
                    tracing::error!(session = %self.session.id(), "flush after a log event failed: {e:#}");
                }
            }
            Command::Shutdown { reply } => *shutdown = Some(reply),
        }
    }

    /// Runs one turn while still accepting commands: follow-ups queue, injects are staged for the
    /// next step, flushes wait for the turn end, shutdown cancels the turn.
    async fn turn(
        &mut self,
        item: Queued,
        rx: &mut mpsc::UnboundedReceiver<Command>,
        shutdown: &mut Option<oneshot::Sender<()>>,
    ) -> TurnEnd {
        let cancel = CancellationToken::new();
        if let Ok(mut current) = self.shared.current.lock() {
            *current = Some(cancel.clone());
        }
        self.shared.running.store(true, Ordering::SeqCst);
        let Queued { message, preamble, reply } = item;
        let mut flushes = Vec::new();
        let mut readers = Vec::new();
        let mut next_route = None;
        let mut late_logs = Vec::new();
        let mut end = {
            let input = turn::TurnInput { message, preamble };
            let run = turn::run_turn(
                &mut self.session,
                &self.deps,
                input,
                cancel.clone(),
                &self.staged,
                &self.shared.disposing,
            );
            tokio::pin!(run);
            loop {
                tokio::select! {
                    end = &mut run => break end,
                    command = rx.recv() => match command {
                        Some(Command::Followup(queued)) => self.queue.push_back(queued),
                        Some(Command::Inject { message }) => {
                            if let Ok(mut staged) = self.staged.lock() {
                                staged.push(message);
                            }
                        }
                        Some(Command::Flush { reply }) => flushes.push(reply),
                        Some(Command::Read(reader)) => readers.push(reader),
                        Some(Command::SetRoute(route)) => next_route = Some(route),
                        Some(Command::Log(body)) => late_logs.push(body),
                        Some(Command::Shutdown { reply }) => {
                            self.shared.disposing.store(true, Ordering::SeqCst);
                            cancel.cancel();
                            *shutdown = Some(reply);
                        }
                        None => {
                            self.shared.disposing.store(true, Ordering::SeqCst);
                            cancel.cancel();
                        }
                    },
                }
            }
        };
        // Injects that arrived too late for a step land between turns.
        let late: Vec<_> = self.staged.lock().map(|mut s| s.drain(..).collect()).unwrap_or_default();
        for message in late {
            self.session.push(message);
        }
        for body in late_logs {
            self.session.push(body);
        }
        let flushed = self.session.flush().map_err(|e| format!("{e:#}"));
        if let Err(e) = &flushed {
            tracing::error!(session = %self.session.id(), "flush at turn end failed: {e}");
            if !matches!(end, TurnEnd::Error(_)) {
                end = TurnEnd::Error(format!("could not persist the session log: {e}"));
            }
        }
        for reply in flushes {
            let _ = reply.send(flushed.clone());
        }
        for reader in readers {
            reader(&self.session);
        }
        // A model change asked for during the turn applies from the next turn.
        if let Some(route) = next_route {
            self.deps.route = route;
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
