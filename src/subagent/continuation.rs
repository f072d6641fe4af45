//! The continuation manager (seed 003, dsh-design.md §1.6.5): continuable background children.
//! A continuable child is one durable session with at most one process-local Activation. States
//! are derived, not stored: running (turns accepted and not yet ended), waiting (quiescent but
//! owning live children), settled (quiescent, no live children) → best-effort flush, disposal,
//! release from the parent, child-first. Follow-ups route by residency: enqueue on a live
//! Activation, or cold-resume a settled child from its log without any provider.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::agents::Launch;
use super::descriptor::{Descriptor, ToolFilter};
use super::inprocess::{ChildDisplay, ChildFactory, ChildSetup, child_header, describe, last_assistant_text};
use super::{
    ErrorCode, Lifecycle, NamedAgent, StartRequest, StopReason, SubagentError, SubagentService, child_depth,
    child_title,
};
use crate::agent::{AgentHandle, NotAccepted, Restored, TurnEnd};
use crate::model::ModelRoute;
use crate::session::event::{InboxSplice, InboxTarget};
use crate::session::{Event, SessionHeader, now_ms};
use crate::tools::{Caller, Tool};

/// How a child's report reaches its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportDelivery {
    /// Appended to the parent's history without starting a turn.
    Quiet,
    /// A new parent turn.
    Wakeup,
}

/// Deployment choices of the manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContinuationSettings {
    /// Tell a live parent when a child settles (dsh's later behaviour; off in the seed era).
    pub settlement_notice: bool,
    pub report_delivery: ReportDelivery,
}

impl Default for ContinuationSettings {
    fn default() -> Self {
        ContinuationSettings { settlement_notice: false, report_delivery: ReportDelivery::Quiet }
    }
}

/// One live continuable child.
struct Activation {
    handle: AgentHandle,
    parent_id: String,
    provider: String,
    run_id: String,
    cwd: Option<String>,
    /// Live continuable children this child started (it cannot settle while any remain).
    owned: HashSet<String>,
    /// Turns accepted (or being written) and not yet ended.
    pending: usize,
    last_end: Option<TurnEnd>,
    /// A settlement is under way (waiting for the log to be written).
    settling: bool,
}

#[derive(Default)]
struct State {
    activations: HashMap<String, Activation>,
    /// Children being resumed or disposed: a follow-up waits for the transition to finish.
    transitions: HashSet<String>,
}

/// Builds the tools a continuable child gets (its `report` tool).
pub(crate) type ChildTools = Arc<dyn Fn(&Arc<ContinuationManager>) -> Vec<Arc<dyn Tool>> + Send + Sync>;

/// Owns every Activation of one process.
pub struct ContinuationManager {
    service: Arc<SubagentService>,
    factory: Weak<dyn ChildFactory>,
    settings: ContinuationSettings,
    child_tools: ChildTools,
    state: Mutex<State>,
    draining: AtomicBool,
}

fn err(code: ErrorCode, message: String) -> SubagentError {
    SubagentError::new(code, message)
}

/// What a continuable child is composed of, as its descriptor records it.
#[derive(Debug, Clone, PartialEq)]
struct Composition {
    route: ModelRoute,
    persona: Option<String>,
    tool_filter: Option<ToolFilter>,
    agent: Option<NamedAgent>,
}

/// Says in the log how a cold-resumed child's agent compares with its definition now: the child
/// always resumes with what it recorded, even when the file changed or is gone.
fn note_definition(child_id: &str, recorded: &Composition, now: Option<&Launch>, parent_route: &ModelRoute) {
    let Some(agent) = &recorded.agent else { return };
    let name = &agent.name;
    match now {
        None => tracing::warn!(
            child = %child_id,
            "subagent {child_id}: the agent {name:?} it was started as is no longer defined; it resumes with the persona, tools and model it recorded"
        ),
        Some(now) => {
            let current = Composition {
                route: now.route.clone().unwrap_or_else(|| parent_route.clone()),
                persona: now.persona.clone(),
                tool_filter: now.tool_filter.clone(),
                agent: Some(now.agent.clone()),
            };
            if current == *recorded {
                tracing::debug!(child = %child_id, "subagent {child_id} resumes as the agent {name:?}, unchanged");
            } else {
                tracing::info!(
                    child = %child_id,
                    "subagent {child_id}: the agent {name:?} changed since it started; it resumes with the persona, tools and model it recorded"
                );
            }
        }
    }
}

/// What a failed start or resume rolls back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rollback {
    /// A child created by this start: its Activation and its log.
    Child,
    /// A cold resume: the Activation only (the durable child stays).
    Activation,
}

/// What a message the child's agent refused leaves behind (`submit_then`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnRefusal {
    /// The child settles when nothing else is pending, as after any turn.
    Settle,
    /// Only the pending count is taken back: the caller rolls the Activation back.
    Abandon,
}

/// How far below the caller a control call's target may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// `send_message`: only the caller's own children.
    Child,
    /// `interrupt_agent`: any descendant.
    Descendant,
}

/// Parent links followed from a stored target towards its caller.
const MAX_ANCESTRY: usize = 64;

/// A live agent that is not a continuable child of the caller: the caller itself, or a busy
/// top-level session.
fn not_a_child(id: &str) -> SubagentError {
    err(ErrorCode::Unauthorized, format!("subagent \"{id}\" is live but not a continuable child of this agent"))
}

fn another_parent(id: &str) -> SubagentError {
    err(ErrorCode::Unauthorized, format!("subagent \"{id}\" belongs to another parent session"))
}

fn unavailable(id: &str) -> SubagentError {
    err(ErrorCode::NotResumable, format!("subagent \"{id}\" is unavailable"))
}

/// What `to_completion` calls a message's acceptance.
const DELIVERY: &str = "the delivery of the message";

/// A follow-up its caller called off before the message was handed to the child: nothing of it
/// was written.
fn not_handed_over(id: &str) -> SubagentError {
    err(
        ErrorCode::Cancelled,
        format!("tool call aborted before the message was handed to subagent \"{id}\"; it was not delivered"),
    )
}

/// Why a message to a live agent was not delivered, as the sender's error.
fn undelivered(e: &NotAccepted) -> SubagentError {
    match e {
        NotAccepted::Gone(_) => parent_unavailable(),
        NotAccepted::Unwritten { .. } => err(ErrorCode::Infrastructure, format!("report not delivered: {e}")),
    }
}

fn parent_unavailable() -> SubagentError {
    err(ErrorCode::ParentUnavailable, "direct parent is not live; report was not delivered".into())
}

/// Runs an acceptance on a task of its own and awaits its outcome. Once a message is handed to a
/// child (or a child is resumed, or created, to take one), its acceptance must end whatever
/// becomes of the caller: the durable write awaited and its turn watched (so the child settles
/// after it), or a refusal rolled back. A caller whose future is dropped meanwhile only stops
/// listening. `what` names the acceptance in the error of one that ended abnormally.
async fn to_completion<T: Send + 'static>(
    what: &str,
    work: impl std::future::Future<Output = Result<T, SubagentError>> + Send + 'static,
) -> Result<T, SubagentError> {
    tokio::spawn(work).await.unwrap_or_else(|e| {
        let cause = format!("{what} ended abnormally (it may have taken effect): {e}");
        Err(err(ErrorCode::Infrastructure, cause))
    })
}

/// A control call's target must be a session id before it is looked up anywhere.
fn valid_target(id: &str) -> Result<(), SubagentError> {
    crate::session::layout::validate_session_id(id)
        .map_err(|reason| err(ErrorCode::NotResumable, format!("subagent \"{id}\" is unavailable ({reason})")))
}

impl ContinuationManager {
    pub fn new(
        service: Arc<SubagentService>,
        factory: Weak<dyn ChildFactory>,
        settings: ContinuationSettings,
        child_tools: ChildTools,
    ) -> Self {
        ContinuationManager {
            service,
            factory,
            settings,
            child_tools,
            state: Mutex::default(),
            draining: AtomicBool::new(false),
        }
    }

    pub fn settings(&self) -> ContinuationSettings {
        self.settings
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn factory(&self) -> Result<Arc<dyn ChildFactory>, SubagentError> {
        self.factory.upgrade().ok_or_else(|| err(ErrorCode::Infrastructure, "the runtime is shutting down".into()))
    }

    fn assert_admitting(&self) -> Result<(), SubagentError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(err(ErrorCode::Draining, "continuable subagents are draining; no new work is accepted".into()));
        }
        Ok(())
    }

    /// True while `id` has a live Activation.
    pub fn is_resident(&self, id: &str) -> bool {
        self.state().activations.contains_key(id)
    }

    /// Starts a background child and resolves once its inbox accepted the prompt:
    /// `(child_id, message_id)`. Any failure before that leaves no child behind. The start runs to
    /// its end on a task of its own (`to_completion`): a caller cancelled or dropped meanwhile
    /// (a tool call cut short) neither leaves a half-made child nor one whose turn nobody watches.
    pub async fn start(
        self: &Arc<Self>,
        provider_name: &str,
        label: String,
        request: StartRequest,
    ) -> Result<(String, String), SubagentError> {
        let (manager, provider_name) = (self.clone(), provider_name.to_string());
        to_completion(
            "the start of the subagent",
            async move { manager.start_now(&provider_name, label, request).await },
        )
        .await
    }

    async fn start_now(
        self: &Arc<Self>,
        provider_name: &str,
        label: String,
        request: StartRequest,
    ) -> Result<(String, String), SubagentError> {
        self.assert_admitting()?;
        let provider = self.service.provider(provider_name)?;
        let mut seed = provider.prepare_continuable(&request.parent).ok_or_else(|| {
            err(
                ErrorCode::UnsupportedCapability,
                format!("subagent provider \"{provider_name}\" does not support continuable children (no prepareContinuable capability)"),
            )
        })?;
        let depth = child_depth(request.parent.depth, request.max_depth)?;
        let factory = self.factory()?;
        let route = request.route.clone().unwrap_or_else(|| request.parent.route.clone());
        let display = ChildDisplay {
            title: child_title(request.agent.as_ref().map(|a| a.name.as_str()), Some(&label)),
            description: describe(&request.prompt),
            call_id: request.call_id.clone(),
        };
        let descriptor = Descriptor::Continuable {
            provider: provider_name.to_string(),
            label,
            agent_provider: Some(route.provider.clone()),
            agent_model: Some(route.model.clone()),
            persona: request.persona.clone(),
            tool_filter: request.tool_filter.clone(),
            agent: request.agent.as_ref().map(NamedAgent::record),
        };
        let lineage = seed.len();
        seed.push(Event::new(lineage as u64, now_ms(), descriptor.event(), None));
        let header = child_header(factory.mint_id(), &request.parent.header, depth, lineage);
        let (child_id, cwd) = (header.id.clone(), header.cwd.clone());
        let session = factory.create_session(header, seed)?;
        let composition = Composition {
            route,
            persona: request.persona.clone(),
            tool_filter: request.tool_filter.clone(),
            agent: request.agent.clone(),
        };
        let setup = self.setup(composition, display);
        let handle = factory.start_agent(session, Restored::none(), setup);
        self.install(&child_id, handle, &request.parent.header.id, provider_name, cwd, 0);
        match self.submit_then(&child_id, request.prompt, json!({"kind": "user"}), OnRefusal::Abandon).await {
            Ok(message_id) => Ok((child_id, message_id)),
            Err(e) => {
                self.abandon(&child_id, &e.message, Rollback::Child).await;
                Err(e)
            }
        }
    }

    fn setup(self: &Arc<Self>, composition: Composition, display: ChildDisplay) -> ChildSetup {
        let Composition { route, persona, tool_filter, agent } = composition;
        let extra_tools = (self.child_tools)(self);
        ChildSetup { route, persona, tool_filter, extra_tools, display, progress: None, agent }
    }

    /// Publishes a fresh Activation (and the parent's ownership of it) and emits `subagent/start`;
    /// `pending` turns are already accepted (restored from its log).
    fn install(
        &self,
        child_id: &str,
        handle: AgentHandle,
        parent_id: &str,
        provider: &str,
        cwd: Option<String>,
        pending: usize,
    ) {
        let run_id = uuid::Uuid::new_v4().to_string();
        {
            let mut state = self.state();
            if let Some(parent) = state.activations.get_mut(parent_id) {
                parent.owned.insert(child_id.to_string());
            }
            state.activations.insert(
                child_id.to_string(),
                Activation {
                    handle,
                    parent_id: parent_id.to_string(),
                    provider: provider.to_string(),
                    run_id: run_id.clone(),
                    cwd,
                    owned: HashSet::new(),
                    pending,
                    last_end: None,
                    settling: false,
                },
            );
        }
        self.service.emit(&Lifecycle::Start { run_id, provider: provider.into(), id: child_id.into(), local: true });
    }

    /// Rolls back an Activation whose first prompt was never accepted: the agent is disposed and
    /// the `subagent/start` already emitted is closed by its `subagent/end` with the cause. A
    /// child just created (`Rollback::Child`) also loses its log (with its descriptor), so it is
    /// neither listable nor resumable.
    async fn abandon(&self, child_id: &str, cause: &str, rollback: Rollback) {
        let removed = {
            let mut state = self.state();
            let removed = state.activations.remove(child_id);
            if let Some(act) = &removed
                && let Some(parent) = state.activations.get_mut(&act.parent_id)
            {
                parent.owned.remove(child_id);
            }
            removed
        };
        let Some(act) = removed else { return };
        match (self.factory(), rollback) {
            (Ok(factory), Rollback::Child) => factory.roll_back(child_id, Some(act.handle.clone())).await,
            (Ok(factory), Rollback::Activation) => {
                act.handle.shutdown().await;
                factory.release(child_id);
            }
            (Err(_), _) => act.handle.shutdown().await,
        }
        self.service.emit(&Lifecycle::End {
            run_id: act.run_id.clone(),
            provider: act.provider.clone(),
            id: child_id.to_string(),
            local: true,
            cwd: act.cwd.clone(),
            stop_reason: None,
            output: None,
            failure: Some(cause.to_string()),
        });
    }

    /// Queues one message as its own FIFO turn of a resident child, durably; returns the message
    /// id once it is in the child's log. The child does not settle while it is being written.
    async fn submit(
        self: &Arc<Self>,
        child_id: &str,
        content: Vec<Value>,
        source: Value,
    ) -> Result<String, SubagentError> {
        self.submit_then(child_id, content, source, OnRefusal::Settle).await
    }

    /// `submit`, with what a refused message leaves behind: the child settles as after any turn
    /// (`Settle`), or only the pending count is taken back because the caller rolls the
    /// Activation back itself (`Abandon`: a first prompt that was never accepted).
    async fn submit_then(
        self: &Arc<Self>,
        child_id: &str,
        content: Vec<Value>,
        source: Value,
        on_refusal: OnRefusal,
    ) -> Result<String, SubagentError> {
        let closing = || err(ErrorCode::ActivationClosing, format!("subagent \"{child_id}\" is closing"));
        let handle = {
            let mut state = self.state();
            let act = state.activations.get_mut(child_id).ok_or_else(closing)?;
            act.pending += 1;
            act.handle.clone()
        };
        match handle.enqueue(content, source).await {
            Ok((message_id, receiver)) => {
                self.watch_turn(child_id.to_string(), receiver);
                Ok(message_id)
            }
            Err(e) => {
                match on_refusal {
                    OnRefusal::Settle => self.turn_over(child_id.to_string(), None).await,
                    OnRefusal::Abandon => {
                        if let Some(act) = self.state().activations.get_mut(child_id) {
                            act.pending = act.pending.saturating_sub(1);
                        }
                    }
                }
                Err(match e {
                    NotAccepted::Gone(_) => closing(),
                    NotAccepted::Unwritten { .. } => {
                        err(ErrorCode::Infrastructure, format!("message not delivered: {e}"))
                    }
                })
            }
        }
    }

    /// One accepted turn of `child_id` is over (or was never accepted: `end` is `None`); the
    /// child settles when nothing else is pending.
    async fn turn_over(self: &Arc<Self>, child_id: String, end: Option<TurnEnd>) {
        let settle = {
            let mut state = self.state();
            match state.activations.get_mut(&child_id) {
                Some(act) => {
                    act.pending = act.pending.saturating_sub(1);
                    if end.is_some() {
                        act.last_end = end;
                    }
                    act.pending == 0 && act.owned.is_empty()
                }
                None => false,
            }
        };
        if settle {
            self.settle(child_id).await;
        }
    }

    fn watch_turn(self: &Arc<Self>, child_id: String, receiver: oneshot::Receiver<TurnEnd>) {
        let manager = self.clone();
        tokio::spawn(async move {
            let end = receiver.await.unwrap_or(TurnEnd::Disposed);
            manager.turn_over(child_id, Some(end)).await;
        });
    }

    /// Settles a quiescent child with no live children: its log is written (while it cannot be,
    /// the child stays resident and retries, so nothing it holds is lost), then it is disposed,
    /// released from the parent (child-first), `subagent/end` is emitted, and the parent may
    /// settle in turn. New work arriving meanwhile ends the attempt.
    fn settle(self: &Arc<Self>, child_id: String) -> futures::future::BoxFuture<'static, ()> {
        let manager = self.clone();
        Box::pin(async move {
            if !manager.written_before_settling(&child_id).await {
                return;
            }
            let act = {
                let mut state = manager.state();
                let ready = state.activations.get(&child_id).is_some_and(|a| a.pending == 0 && a.owned.is_empty());
                if !ready {
                    return;
                }
                state.transitions.insert(child_id.clone());
                state.activations.remove(&child_id)
            };
            let Some(act) = act else { return };
            let output = manager.dispose(&child_id, &act).await;
            let parent_settles = {
                let mut state = manager.state();
                state.transitions.remove(&child_id);
                match state.activations.get_mut(&act.parent_id) {
                    Some(parent) => {
                        parent.owned.remove(&child_id);
                        parent.pending == 0 && parent.owned.is_empty()
                    }
                    None => false,
                }
            };
            let stop_reason = stop_reason(act.last_end.as_ref());
            manager.service.emit(&Lifecycle::End {
                run_id: act.run_id.clone(),
                provider: act.provider.clone(),
                id: child_id.clone(),
                local: true,
                cwd: act.cwd.clone(),
                stop_reason: Some(stop_reason),
                output: Some(output.clone()),
                failure: turn_failure(act.last_end.as_ref()),
            });
            if manager.settings.settlement_notice {
                manager.notify_parent(&child_id, &act.parent_id, stop_reason, &output).await;
            }
            if parent_settles {
                manager.settle(act.parent_id.clone()).await;
            }
        })
    }

    /// Waits until a settling child's log is written, retrying while it cannot be (the writer
    /// warns, rate-limited). False when the child is no longer ready to settle (new work, a
    /// settlement already under way, or gone).
    async fn written_before_settling(&self, child_id: &str) -> bool {
        let ready =
            |state: &State| state.activations.get(child_id).is_some_and(|a| a.pending == 0 && a.owned.is_empty());
        let handle = {
            let mut state = self.state();
            if !ready(&state) {
                return false;
            }
            let Some(act) = state.activations.get_mut(child_id) else { return false };
            if std::mem::replace(&mut act.settling, true) {
                return false;
            }
            act.handle.clone()
        };
        let mut delay = Duration::from_millis(100);
        let written = loop {
            if handle.flush().await.is_ok() {
                break true;
            }
            if handle.is_gone() {
                // An agent that stopped has made its last write (or logged why it could not):
                // retrying cannot help, and its Activation must still settle and be released.
                tracing::warn!(child = %child_id, "settling a subagent whose agent has stopped");
                break true;
            }
            if self.draining.load(Ordering::SeqCst) || !ready(&self.state()) {
                break false;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
            if !ready(&self.state()) {
                break false;
            }
        };
        let mut state = self.state();
        if let Some(act) = state.activations.get_mut(child_id) {
            act.settling = false;
        }
        written && ready(&state)
    }

    /// Reads the closing text, disposes and releases (the log was written just before).
    async fn dispose(&self, child_id: &str, act: &Activation) -> String {
        let output = act.handle.read(|s| last_assistant_text(s.events(), 0)).await.unwrap_or_default();
        act.handle.shutdown().await;
        if let Ok(factory) = self.factory() {
            factory.release(child_id);
        }
        output
    }

    /// `Background subagent <id> finished…` to the live parent: a new turn when idle; when busy,
    /// input to its next step, or a turn of its own after this one if no step takes it (dsh's
    /// `steer`; a continuable parent's turns are the manager's, so it queues one as when idle);
    /// while draining, input without a turn. A failed delivery is logged and dropped.
    async fn notify_parent(self: &Arc<Self>, child_id: &str, parent_id: &str, stop: StopReason, output: &str) {
        let subject = format!("Background subagent {child_id}");
        let summary = match stop {
            StopReason::Completed => format!("{subject} finished and will do no further work unless you send it more."),
            StopReason::Aborted => format!("{subject} was stopped before it finished."),
            StopReason::MaxTokens => format!("{subject} ran out of room before it finished."),
            StopReason::Refusal => format!("{subject} declined the task."),
            StopReason::Error => format!("{subject} failed before it finished."),
        };
        let mut content = vec![json!({"type": "text", "text": summary})];
        if output.is_empty() {
            content.push(json!({"type": "text", "text": "It left no closing message."}));
        } else {
            content.push(json!({"type": "text", "text": "Its closing message:"}));
            content.push(json!({"type": "text", "text": output}));
        }
        let source = json!({"kind": crate::agent::SETTLED_SOURCE, "form": "notice", "summary": summary, "senderSessionId": child_id});
        let busy = self.factory().ok().and_then(|f| f.live_agent(parent_id)).filter(|p| p.is_running());
        let delivered = match busy {
            _ if self.draining.load(Ordering::SeqCst) => self.deliver(parent_id, content, source, false).await,
            Some(parent) if !self.is_resident(parent_id) => {
                parent.steer(content, source).await.map_err(|e| undelivered(&e))
            }
            _ => self.deliver(parent_id, content, source, true).await,
        };
        if let Err(e) = delivered {
            tracing::warn!(child = %child_id, "settlement notice was not delivered to its parent: {e}");
        }
    }

    /// Delivers a message to a live agent, durably: `wake` starts a turn (counted when the
    /// recipient is a continuable child), otherwise it is injected without a turn.
    async fn deliver(
        self: &Arc<Self>,
        recipient: &str,
        content: Vec<Value>,
        source: Value,
        wake: bool,
    ) -> Result<String, SubagentError> {
        if wake && self.is_resident(recipient) {
            return self.submit(recipient, content, source).await;
        }
        let agent = self.factory()?.live_agent(recipient).ok_or_else(parent_unavailable)?;
        let sent = if wake {
            agent.enqueue(content, source).await.map(|(id, _)| id)
        } else {
            agent.inject(content, source).await
        };
        sent.map_err(|e| undelivered(&e))
    }

    /// `send_message`: routes by residency. Only the exact direct parent may deliver.
    pub async fn followup(
        self: &Arc<Self>,
        caller: &Caller,
        child_id: &str,
        content: Vec<Value>,
        source: Value,
    ) -> Result<String, SubagentError> {
        self.followup_unless(caller, child_id, content, source, &CancellationToken::new()).await
    }

    /// `followup`, called off (`ErrorCode::Cancelled`, nothing written) when `cancel` fires
    /// before the message is handed to the child. From the hand-off on, neither `cancel` nor a
    /// dropped future cuts the acceptance short (`to_completion`): the answer is the outcome of
    /// the durable write, and the child settles after the message's turn as after any other.
    pub async fn followup_unless(
        self: &Arc<Self>,
        caller: &Caller,
        child_id: &str,
        content: Vec<Value>,
        source: Value,
        cancel: &CancellationToken,
    ) -> Result<String, SubagentError> {
        valid_target(child_id)?;
        loop {
            self.assert_admitting()?;
            let transitioning = {
                let state = self.state();
                if let Some(act) = state.activations.get(child_id) {
                    if child_id == caller.header.id {
                        return Err(not_a_child(child_id));
                    }
                    if act.parent_id != caller.header.id {
                        return Err(another_parent(child_id));
                    }
                    false
                } else {
                    state.transitions.contains(child_id)
                }
            };
            if transitioning {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                    () = cancel.cancelled() => return Err(not_handed_over(child_id)),
                }
                continue;
            }
            // The last point where the caller may still call it off: nothing has reached the
            // child yet (a resume, too, is part of the acceptance).
            if cancel.is_cancelled() {
                return Err(not_handed_over(child_id));
            }
            let resident = self.is_resident(child_id);
            let (manager, child) = (self.clone(), child_id.to_string());
            let (message, from) = (content.clone(), source.clone());
            let outcome = if resident {
                to_completion(DELIVERY, async move { manager.submit(&child, message, from).await }).await
            } else {
                let (parent_id, route) = (caller.header.id.clone(), caller.route.clone());
                to_completion(
                    DELIVERY,
                    async move { manager.cold_resume(&parent_id, &route, &child, message, from).await },
                )
                .await
            };
            match outcome {
                // Nothing was handed over: the Activation closed first, or (a cold resume) the
                // child began to settle between the check above and the resume. The next round
                // waits for that transition.
                Err(e) if e.code == ErrorCode::ActivationClosing => continue,
                other => return other,
            }
        }
    }

    /// The checks of a control call on a target without an Activation, from what is known
    /// without loading it: a live agent that is not a continuable child is refused (unless
    /// `settling`: a continuable child between its Activation and its release), and so is a
    /// stored session not below `caller_id` (its child, or with `Reach::Descendant` any
    /// descendant). Only headers are read, so a refused call writes nothing anywhere.
    fn authorize_stored(
        factory: &dyn ChildFactory,
        caller_id: &str,
        target: &str,
        reach: Reach,
        settling: bool,
    ) -> Result<crate::session::SessionHeader, SubagentError> {
        if !settling && factory.live_agent(target).is_some() {
            return Err(not_a_child(target));
        }
        let header = factory.stored_header(target).ok_or_else(|| unavailable(target))?;
        let mut parent = header.parent_session.clone();
        for _ in 0..MAX_ANCESTRY {
            match parent {
                Some(id) if id == caller_id => return Ok(header),
                Some(id) if reach == Reach::Descendant => {
                    parent = factory.stored_header(&id).and_then(|h| h.parent_session);
                }
                _ => break,
            }
        }
        Err(another_parent(target))
    }

    /// The continuation state of a stored child of the caller, read without repairing its log:
    /// a child the catalog lists as corrupt or unsupported is refused with that reason.
    fn continuation_state(
        factory: &dyn ChildFactory,
        header: &crate::session::SessionHeader,
    ) -> Result<Descriptor, SubagentError> {
        let id = header.id.as_str();
        let events = factory.stored_events(id).map_err(|_| unavailable(id))?;
        match super::catalog::own_descriptor(&events, header.seed_length.unwrap_or(0)) {
            Ok(Some(descriptor @ Descriptor::Continuable { .. })) => Ok(descriptor),
            Ok(Some(Descriptor::OneShot { .. }) | None) => Err(err(
                ErrorCode::NotResumable,
                format!(
                    "subagent \"{id}\" has no supported continuation state and cannot be resumed; do not retry send_message with this id"
                ),
            )),
            Err(reason) => Err(err(
                ErrorCode::NotResumable,
                format!(
                    "subagent \"{id}\" is {} (its subagent descriptor cannot be used) and cannot be resumed; do not retry send_message with this id",
                    reason.as_str()
                ),
            )),
        }
    }

    /// Resumes a settled child from its log (no provider involved) and submits the message
    /// (after the ones its log still holds). `parent_id` is the caller's (the child's parent),
    /// `route` its route (the fallback of a descriptor without one).
    async fn cold_resume(
        self: &Arc<Self>,
        parent_id: &str,
        route: &ModelRoute,
        child_id: &str,
        content: Vec<Value>,
        source: Value,
    ) -> Result<String, SubagentError> {
        self.materialize(parent_id, child_id, route).await?;
        match self.submit_then(child_id, content, source, OnRefusal::Abandon).await {
            Ok(id) => Ok(id),
            Err(e) => {
                // A resumed child keeps its log: only this Activation is rolled back.
                self.abandon(child_id, &e.message, Rollback::Activation).await;
                Err(e)
            }
        }
    }

    /// Makes a stored child of `parent_id` resident again from its log (authorized from its
    /// header and descriptor before the repairing load), and starts the turns of the inbox
    /// messages its log holds, in order. `fallback` is the route of a descriptor without one.
    async fn materialize(
        self: &Arc<Self>,
        parent_id: &str,
        child_id: &str,
        fallback: &ModelRoute,
    ) -> Result<(), SubagentError> {
        let factory = self.factory()?;
        {
            let mut state = self.state();
            if state.activations.contains_key(child_id) || !state.transitions.insert(child_id.to_string()) {
                return Err(err(
                    ErrorCode::ActivationClosing,
                    format!("subagent \"{child_id}\" is changing state; retry"),
                ));
            }
        }
        let result = (|| {
            let header = Self::authorize_stored(&*factory, parent_id, child_id, Reach::Child, false)?;
            let descriptor = Self::continuation_state(&*factory, &header)?;
            let Descriptor::Continuable { provider, label, agent_provider, agent_model, persona, tool_filter, agent } =
                descriptor
            else {
                return Err(unavailable(child_id));
            };
            let (session, restored) = factory.load_session(child_id).map_err(|reason| {
                err(ErrorCode::NotResumable, format!("subagent \"{child_id}\" cannot be resumed: {reason}"))
            })?;
            let route = match (agent_provider, agent_model) {
                (Some(provider), Some(model)) => ModelRoute { provider, model },
                _ => fallback.clone(),
            };
            let cwd = session.header.cwd.clone();
            let agent = agent.as_ref().map(NamedAgent::from_record);
            let title = child_title(agent.as_ref().map(|a| a.name.as_str()), Some(&label));
            let display = ChildDisplay { title, ..ChildDisplay::default() };
            let recorded = Composition { route, persona, tool_filter, agent };
            if let Some(named) = &recorded.agent {
                let now = factory.agent_now(parent_id, &named.name);
                note_definition(child_id, &recorded, now.as_ref(), fallback);
            }
            let pending = restored.len();
            let handle = factory.start_agent(session, restored, self.setup(recorded, display));
            Ok((handle, provider, cwd, pending))
        })();
        let outcome = match result {
            Ok((handle, provider, cwd, pending)) => {
                self.install(child_id, handle.clone(), parent_id, &provider, cwd, pending);
                Ok(handle)
            }
            Err(e) => Err(e),
        };
        self.state().transitions.remove(child_id);
        let handle = outcome?;
        for (_, turn) in handle.wake().await.unwrap_or_default() {
            self.watch_turn(child_id.to_string(), turn);
        }
        Ok(())
    }

    /// After a session was loaded or resumed: cold-resumes each stored continuable child below
    /// it that has inbox messages pending or a turn a crash cut, or a descendant that has (so
    /// that it hears their reports), parents first, and runs the pending messages in order. A child that cannot be
    /// resumed is logged and skipped (its messages stay pending in its log).
    pub async fn restore_below(self: &Arc<Self>, root_id: &str, fallback: &ModelRoute) {
        let Ok(factory) = self.factory() else { return };
        // One listing of the store for the whole tree (a listing per child made a reload
        // quadratic in the number of children).
        let mut children: HashMap<String, Vec<SessionHeader>> = HashMap::new();
        for header in factory.stored_subagents() {
            if let Some(parent) = header.parent_session.clone() {
                children.entry(parent).or_default().push(header);
            }
        }
        for siblings in children.values_mut() {
            siblings.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        }
        let mut plan = Vec::new();
        self.plan_restore(&*factory, &children, root_id, 0, &mut plan);
        let mut resumed = Vec::new();
        // Children whose resume failed: their descendants stay on disk too (their messages stay
        // pending). Resumed under no live parent, one would run with the start's permissions and
        // sandbox rather than its session's, and could not report.
        let mut failed: HashSet<String> = HashSet::new();
        for (parent_id, child_id) in plan {
            if failed.contains(&parent_id) {
                tracing::warn!(child = %child_id, "a subagent with pending messages was not resumed: its parent was not");
                failed.insert(child_id);
                continue;
            }
            if self.is_resident(&child_id) {
                continue;
            }
            match self.materialize(&parent_id, &child_id, fallback).await {
                Ok(()) => resumed.push(child_id),
                Err(e) => {
                    tracing::warn!(child = %child_id, "a subagent with pending messages was not resumed: {e}");
                    failed.insert(child_id);
                }
            }
        }
        // A child resumed only for its descendants settles once they have.
        for child_id in resumed.into_iter().rev() {
            self.settle_if_idle(&child_id).await;
        }
    }

    /// Settles `child_id` if it has nothing pending and no live children.
    async fn settle_if_idle(self: &Arc<Self>, child_id: &str) {
        let ready = self.state().activations.get(child_id).is_some_and(|a| a.pending == 0 && a.owned.is_empty());
        if ready {
            self.settle(child_id.to_string()).await;
        }
    }

    /// The stored continuable children below `parent_id` to resume, parents first, as (parent,
    /// child); true when any of them has work. `children` are the stored subagents by parent,
    /// oldest first by (`createdAt`, id).
    fn plan_restore(
        &self,
        factory: &dyn ChildFactory,
        children: &HashMap<String, Vec<SessionHeader>>,
        parent_id: &str,
        depth: usize,
        plan: &mut Vec<(String, String)>,
    ) -> bool {
        if depth >= MAX_ANCESTRY {
            return false;
        }
        let mut any = false;
        for header in children.get(parent_id).map(Vec::as_slice).unwrap_or_default() {
            let Ok(events) = factory.stored_events(&header.id) else { continue };
            let seed_length = header.seed_length.unwrap_or(0);
            let continuable = matches!(
                super::catalog::own_descriptor(&events, seed_length),
                Ok(Some(Descriptor::Continuable { .. }))
            );
            if !continuable {
                continue;
            }
            let pending = match crate::session::inbox::fold(&events, seed_length) {
                Ok(inbox) => !inbox.is_idle(),
                Err(e) => {
                    tracing::warn!(child = %header.id, "the inbox of a subagent cannot be read: {e}");
                    false
                }
            };
            // A turn a crash cut (kin stopped while the child worked): resumed, its load closes
            // the turn, and the child settles (its parent hears it failed, with settlement notices).
            let own = pending || !crate::session::repair::closers(&events).is_empty();
            let at = plan.len();
            plan.push((parent_id.to_string(), header.id.clone()));
            let below = self.plan_restore(factory, children, &header.id, depth + 1, plan);
            if own || below {
                any = true;
            } else {
                plan.truncate(at);
            }
        }
        any
    }

    /// `report`: the exact live continuable child sends content to its direct parent.
    pub async fn report(self: &Arc<Self>, child_id: &str, output: &str) -> Result<String, SubagentError> {
        self.assert_admitting()?;
        let parent_id = self.state().activations.get(child_id).map(|a| a.parent_id.clone()).ok_or_else(|| {
            err(
                ErrorCode::Unauthorized,
                format!("agent \"{child_id}\" is not a live continuable subagent and cannot report"),
            )
        })?;
        let content = vec![
            json!({"type": "text", "text": format!("Background subagent {child_id} reported:")}),
            json!({"type": "text", "text": crate::tools::capture::ends_of(output, super::OUTPUT_LIMITS)}),
        ];
        let source = json!({"kind": "subagent-report", "senderSessionId": child_id});
        self.deliver(&parent_id, content, source, self.settings.report_delivery == ReportDelivery::Wakeup).await
    }

    /// `interrupt_agent`: an ancestor cancels a descendant's current turn; its queued messages
    /// stay, or with `discard` are discarded (durably; the count is returned). A settled
    /// descendant is an accepted no-op (with `discard`, messages its log still holds are
    /// discarded there, `discard_stored`); everything else is refused exactly as `send_message`
    /// refuses it (an invalid or unknown id, a live agent that is not a continuable child — the
    /// caller itself included — and another tree's session).
    pub async fn interrupt(&self, caller_id: &str, target: &str, discard: bool) -> Result<usize, SubagentError> {
        valid_target(target)?;
        // The live tree's links are the runtime's; the caller must be reached through
        // continuable children only.
        let above = self.factory()?.live_ancestors(target);
        let (settling, handle) = {
            let state = self.state();
            match state.activations.get(target) {
                Some(act) => {
                    if target == caller_id {
                        return Err(not_a_child(target));
                    }
                    if !through_continuable(&above, |id| state.activations.contains_key(id), caller_id) {
                        return Err(another_parent(target));
                    }
                    (false, Some(act.handle.clone()))
                }
                None => (state.transitions.contains(target), None),
            }
        };
        match handle {
            Some(handle) => Ok(Self::stop_turn(&handle, discard).await?),
            None => {
                let factory = self.factory()?;
                let header = Self::authorize_stored(&*factory, caller_id, target, Reach::Descendant, settling)?;
                if discard { self.discard_stored(factory, &header).await } else { Ok(0) }
            }
        }
    }

    /// `interrupt_agent` with `discard` on a stored child (no Activation: it settled, or it was
    /// not resumed): a no-op when its log holds no pending message (the usual settled child:
    /// nothing is loaded or written); else they are discarded there (one durable splice, the log
    /// loaded off the async threads), so no later resume runs them, and the count is returned.
    /// Held as a transition meanwhile: a message to it waits, a resume of it is refused.
    async fn discard_stored(
        &self,
        factory: Arc<dyn ChildFactory>,
        header: &SessionHeader,
    ) -> Result<usize, SubagentError> {
        let target = header.id.as_str();
        let seed_length = header.seed_length.unwrap_or(0);
        let pending = factory
            .stored_events(target)
            .ok()
            .and_then(|events| crate::session::inbox::fold(&events, seed_length).ok())
            .is_some_and(|inbox| !inbox.is_idle());
        if !pending {
            return Ok(0);
        }
        {
            let mut state = self.state();
            if state.activations.contains_key(target) || !state.transitions.insert(target.to_string()) {
                return Err(err(
                    ErrorCode::ActivationClosing,
                    format!("subagent \"{target}\" is changing state; retry"),
                ));
            }
        }
        let id = target.to_string();
        let discarded = tokio::task::spawn_blocking(move || {
            let (mut session, restored) = factory.load_session(&id)?;
            let count = restored.len();
            if count > 0 {
                session.push_durably(vec![InboxSplice::discard(InboxTarget::NextTurn, 0, count).into()])?;
            }
            // What loading it repaired or settled is written too (the session is not kept).
            session.flush().map_err(|e| format!("{e:#}"))?;
            Ok::<_, String>(count)
        })
        .await
        .unwrap_or_else(|e| Err(format!("the discard ended abnormally: {e}")));
        self.state().transitions.remove(target);
        discarded.map_err(|e| {
            err(
                ErrorCode::Infrastructure,
                format!("the queued messages of subagent \"{target}\" could not be discarded: {e}"),
            )
        })
    }

    /// Cancels a child's running turn and, with `discard`, its queued messages.
    async fn stop_turn(handle: &AgentHandle, discard: bool) -> Result<usize, SubagentError> {
        if !discard {
            handle.cancel();
            return Ok(0);
        }
        handle
            .cancel_and_discard()
            .await
            .map_err(|e| err(ErrorCode::Infrastructure, format!("the queued messages could not be discarded: {e}")))
    }

    /// The editor's cancel of one background child: its running turn stops and its queued
    /// messages are discarded (an explicit discard, recorded in its log). False when `id` is
    /// not a resident continuable child.
    pub fn cancel_child(&self, id: &str) -> bool {
        let Some(handle) = self.state().activations.get(id).map(|a| a.handle.clone()) else {
            return false;
        };
        let child = id.to_string();
        tokio::spawn(async move {
            if let Err(e) = Self::stop_turn(&handle, true).await {
                tracing::warn!(%child, "cancelling a background subagent: {e}");
            }
        });
        true
    }

    /// Shutdown: closes admission, cancels every Activation and disposes them child-first
    /// (deepest first), flushing each log. Child sessions survive on disk.
    pub async fn drain(self: &Arc<Self>) {
        self.draining.store(true, Ordering::SeqCst);
        let acts: Vec<(String, Activation)> = {
            let mut state = self.state();
            state.activations.drain().collect()
        };
        for unsaved in self.stop_child_first(acts).await {
            tracing::error!("shutdown: {unsaved}");
        }
    }

    /// `session/close` of a top-level session: cancels its continuable children and all their
    /// descendants and disposes them child-first, flushing each log. Other sessions' children
    /// are untouched and admission stays open. Child sessions survive on disk. Returns what could
    /// not be saved: per child whose final flush failed, its id and the cause.
    #[must_use]
    pub async fn close_descendants(self: &Arc<Self>, root_id: &str) -> Vec<String> {
        let factory = self.factory().ok();
        let above = |id: &str| factory.as_ref().map(|f| f.live_ancestors(id)).unwrap_or_default();
        let acts: Vec<(String, Activation)> = {
            let mut state = self.state();
            let below: Vec<String> = {
                let st: &State = &state;
                let continuable = |id: &str| st.activations.contains_key(id);
                st.activations
                    .keys()
                    .filter(|id| through_continuable(&above(id), continuable, root_id))
                    .cloned()
                    .collect()
            };
            below.into_iter().filter_map(|id| state.activations.remove(&id).map(|act| (id, act))).collect()
        };
        self.stop_child_first(acts).await
    }

    /// Stops every Activation given (cancelled, and no queued turn starts), then shuts them down
    /// deepest first, releasing each and emitting its `subagent/end` (aborted). Returns, per
    /// child whose log's final flush failed, its id and the cause.
    async fn stop_child_first(&self, mut acts: Vec<(String, Activation)>) -> Vec<String> {
        for (_, act) in &acts {
            act.handle.stop();
        }
        // How many of the given ones are above it, and the session they hang from.
        let factory = self.factory().ok();
        let depth = |id: &str| {
            let above = factory.as_ref().map(|f| f.live_ancestors(id)).unwrap_or_default();
            above.iter().position(|p| !acts.iter().any(|(i, _)| i == p)).map_or(above.len(), |at| at + 1)
        };
        let depths: HashMap<String, usize> = acts.iter().map(|(id, _)| (id.clone(), depth(id))).collect();
        acts.sort_by_key(|(id, _)| std::cmp::Reverse(depths.get(id).copied().unwrap_or(0)));
        let mut unsaved = Vec::new();
        for (id, act) in acts {
            // Shutdown (not flush first): a turn that had not started when it was cancelled is
            // cancelled by the shutdown command, which the actor reads in order.
            if let Err(cause) = act.handle.dispose().await {
                unsaved.push(format!("subagent {id}: {cause}"));
            }
            if let Ok(factory) = self.factory() {
                factory.release(&id);
            }
            self.service.emit(&Lifecycle::End {
                run_id: act.run_id.clone(),
                provider: act.provider.clone(),
                id: id.clone(),
                local: true,
                cwd: act.cwd.clone(),
                stop_reason: Some(StopReason::Aborted),
                output: None,
                failure: None,
            });
        }
        unsaved
    }
}

/// True when `root_id` is an ancestor of the Activation `id` (through live Activations).
/// True when `target` is among `above` (the live ancestors of a child, nearest first) with only
/// continuable children before it.
fn through_continuable(above: &[String], continuable: impl Fn(&str) -> bool, target: &str) -> bool {
    above.iter().position(|id| id == target || !continuable(id)).is_some_and(|at| above[at] == target)
}

fn stop_reason(end: Option<&TurnEnd>) -> StopReason {
    match end {
        Some(TurnEnd::Completed) => StopReason::Completed,
        Some(TurnEnd::MaxTokens) => StopReason::MaxTokens,
        Some(TurnEnd::Aborted) => StopReason::Aborted,
        Some(TurnEnd::Disposed | TurnEnd::StepLimit(_) | TurnEnd::Error(_)) | None => StopReason::Error,
    }
}

/// The cause of an epoch whose last turn failed, in the child's words.
fn turn_failure(end: Option<&TurnEnd>) -> Option<String> {
    match end {
        Some(TurnEnd::StepLimit(cause) | TurnEnd::Error(cause)) => Some(cause.clone()),
        Some(TurnEnd::Disposed) => Some("the child agent was shut down during its turn".into()),
        None => Some("the child agent ended without a turn".into()),
        Some(TurnEnd::Completed | TurnEnd::MaxTokens | TurnEnd::Aborted) => None,
    }
}
