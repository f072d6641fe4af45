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

use super::descriptor::{Descriptor, ToolFilter};
use super::inprocess::{ChildDisplay, ChildFactory, ChildSetup, child_header, describe, last_assistant_text};
use super::{ErrorCode, Lifecycle, StartRequest, StopReason, SubagentError, SubagentService, child_depth};
use crate::agent::{AgentHandle, TurnEnd};
use crate::model::ModelRoute;
use crate::session::{Event, now_ms};
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
    /// Turns accepted and not yet ended.
    pending: usize,
    last_end: Option<TurnEnd>,
}

#[derive(Default)]
struct State {
    activations: HashMap<String, Activation>,
    /// Children being resumed or disposed: a follow-up waits for the transition to finish.
    transitions: HashSet<String>,
}

/// Builds the tools a continuable child gets (its `report` tool).
pub type ChildTools = Arc<dyn Fn(&Arc<ContinuationManager>) -> Vec<Arc<dyn Tool>> + Send + Sync>;

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

fn another_parent(id: &str) -> SubagentError {
    err(ErrorCode::Unauthorized, format!("subagent \"{id}\" belongs to another parent session"))
}

fn unavailable(id: &str) -> SubagentError {
    err(ErrorCode::NotResumable, format!("subagent \"{id}\" is unavailable"))
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
    /// `(child_id, message_id)`. Any failure before that leaves no child behind.
    pub async fn start(
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
            title: Some(label.clone()),
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
        };
        let lineage = seed.len();
        seed.push(Event::new(lineage as u64, now_ms(), descriptor.event(), None));
        let header = child_header(factory.mint_id(), &request.parent.header, depth, lineage);
        let (child_id, cwd) = (header.id.clone(), header.cwd.clone());
        let session = factory.create_session(header, seed)?;
        let setup = self.setup(route, request.persona.clone(), request.tool_filter.clone(), display);
        let handle = factory.start_agent(session, setup);
        self.install(&child_id, handle, &request.parent.header.id, provider_name, cwd);
        match self.submit(&child_id, request.prompt, json!({"kind": "user"})) {
            Ok(message_id) => Ok((child_id, message_id)),
            Err(e) => {
                self.abandon(&child_id).await;
                Err(e)
            }
        }
    }

    fn setup(
        self: &Arc<Self>,
        route: ModelRoute,
        persona: Option<String>,
        tool_filter: Option<ToolFilter>,
        display: ChildDisplay,
    ) -> ChildSetup {
        ChildSetup { route, persona, tool_filter, extra_tools: (self.child_tools)(self), display, progress: None }
    }

    /// Publishes a fresh Activation (and the parent's ownership of it) and emits `subagent/start`.
    fn install(&self, child_id: &str, handle: AgentHandle, parent_id: &str, provider: &str, cwd: Option<String>) {
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
                    pending: 0,
                    last_end: None,
                },
            );
        }
        self.service.emit(&Lifecycle::Start { run_id, provider: provider.into(), id: child_id.into(), local: true });
    }

    /// Rolls back an Activation whose first prompt was never accepted.
    async fn abandon(&self, child_id: &str) {
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
        if let Some(act) = removed {
            act.handle.shutdown().await;
            if let Ok(factory) = self.factory() {
                factory.release(child_id);
            }
        }
    }

    /// Queues one message as its own FIFO turn of a resident child; returns the message id.
    fn submit(self: &Arc<Self>, child_id: &str, content: Vec<Value>, source: Value) -> Result<String, SubagentError> {
        let receiver = {
            let mut state = self.state();
            let act = state
                .activations
                .get_mut(child_id)
                .ok_or_else(|| err(ErrorCode::ActivationClosing, format!("subagent \"{child_id}\" is closing")))?;
            let (message_id, receiver) = act
                .handle
                .submit(content, source, Vec::new())
                .map_err(|_| err(ErrorCode::ActivationClosing, format!("subagent \"{child_id}\" is closing")))?;
            act.pending += 1;
            (message_id, receiver)
        };
        let (message_id, receiver) = receiver;
        self.watch_turn(child_id.to_string(), receiver);
        Ok(message_id)
    }

    fn watch_turn(self: &Arc<Self>, child_id: String, receiver: oneshot::Receiver<TurnEnd>) {
        let manager = self.clone();
        tokio::spawn(async move {
            let end = receiver.await.unwrap_or(TurnEnd::Disposed);
            let settle = {
                let mut state = manager.state();
                match state.activations.get_mut(&child_id) {
                    Some(act) => {
                        act.pending = act.pending.saturating_sub(1);
                        act.last_end = Some(end);
                        act.pending == 0 && act.owned.is_empty()
                    }
                    None => false,
                }
            };
            if settle {
                manager.settle(child_id).await;
            }
        });
    }

    /// Settles a quiescent child with no live children: flush (best effort), dispose, release
    /// from the parent (child-first), emit `subagent/end`, then let the parent settle in turn.
    fn settle(self: &Arc<Self>, child_id: String) -> futures::future::BoxFuture<'static, ()> {
        let manager = self.clone();
        Box::pin(async move {
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
            });
            if manager.settings.settlement_notice {
                manager.notify_parent(&child_id, &act.parent_id, stop_reason, &output);
            }
            if parent_settles {
                manager.settle(act.parent_id.clone()).await;
            }
        })
    }

    /// Flushes (a failure is logged, not fatal), reads the closing text, disposes and releases.
    async fn dispose(&self, child_id: &str, act: &Activation) -> String {
        if let Err(e) = act.handle.flush().await {
            tracing::warn!(child = %child_id, "final flush of a settling subagent failed: {e}");
        }
        let output = act.handle.read(|s| last_assistant_text(s.events(), 0)).await.unwrap_or_default();
        act.handle.shutdown().await;
        if let Ok(factory) = self.factory() {
            factory.release(child_id);
        }
        output
    }

    /// `Background subagent <id> finished…` to the live parent: a new turn when idle, input to
    /// its next step when busy. A failed delivery is logged and dropped.
    fn notify_parent(self: &Arc<Self>, child_id: &str, parent_id: &str, stop: StopReason, output: &str) {
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
        let source =
            json!({"kind": "subagent-settled", "form": "notice", "summary": summary, "senderSessionId": child_id});
        let busy = self.factory().ok().and_then(|f| f.live_agent(parent_id)).is_some_and(|p| p.is_running());
        let wake = !busy && !self.draining.load(Ordering::SeqCst);
        if let Err(e) = self.deliver(parent_id, content, source, wake) {
            tracing::warn!(child = %child_id, "settlement notice was not delivered to its parent: {e}");
        }
    }

    /// Delivers a message to a live agent: `wake` starts a turn (counted when the recipient is a
    /// continuable child), otherwise it is injected without a turn.
    fn deliver(
        self: &Arc<Self>,
        recipient: &str,
        content: Vec<Value>,
        source: Value,
        wake: bool,
    ) -> Result<String, SubagentError> {
        if wake && self.is_resident(recipient) {
            return self.submit(recipient, content, source);
        }
        let unavailable =
            || err(ErrorCode::ParentUnavailable, "direct parent is not live; report was not delivered".into());
        let agent = self.factory()?.live_agent(recipient).ok_or_else(unavailable)?;
        let sent = if wake {
            agent.submit(content, source, Vec::new()).map(|(id, _)| id)
        } else {
            agent.inject(content, source)
        };
        sent.map_err(|_| unavailable())
    }

    /// `send_message`: routes by residency. Only the exact direct parent may deliver.
    pub async fn followup(
        self: &Arc<Self>,
        caller: &Caller,
        child_id: &str,
        content: Vec<Value>,
        source: Value,
    ) -> Result<String, SubagentError> {
        valid_target(child_id)?;
        loop {
            self.assert_admitting()?;
            let transitioning = {
                let state = self.state();
                if let Some(act) = state.activations.get(child_id) {
                    if act.parent_id != caller.header.id {
                        return Err(another_parent(child_id));
                    }
                    false
                } else {
                    state.transitions.contains(child_id)
                }
            };
            if transitioning {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            if self.is_resident(child_id) {
                match self.submit(child_id, content.clone(), source.clone()) {
                    Err(e) if e.code == ErrorCode::ActivationClosing => continue,
                    other => return other,
                }
            }
            return self.cold_resume(caller, child_id, content, source).await;
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
            return Err(err(
                ErrorCode::Unauthorized,
                format!("subagent \"{target}\" is live but not a continuable child of this agent"),
            ));
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

    /// Resumes a settled child from its log (no provider involved) and submits the message.
    async fn cold_resume(
        self: &Arc<Self>,
        caller: &Caller,
        child_id: &str,
        content: Vec<Value>,
        source: Value,
    ) -> Result<String, SubagentError> {
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
            // Authorized from the header and the stored descriptor before the repairing load.
            let header = Self::authorize_stored(&*factory, &caller.header.id, child_id, Reach::Child, false)?;
            let descriptor = Self::continuation_state(&*factory, &header)?;
            let Descriptor::Continuable { provider, label, agent_provider, agent_model, persona, tool_filter } =
                descriptor
            else {
                return Err(unavailable(child_id));
            };
            let session = factory.load_session(child_id).map_err(|_| unavailable(child_id))?;
            let route = match (agent_provider, agent_model) {
                (Some(provider), Some(model)) => ModelRoute { provider, model },
                _ => caller.route.clone(),
            };
            let cwd = session.header.cwd.clone();
            let display = ChildDisplay { title: Some(label), ..ChildDisplay::default() };
            let handle = factory.start_agent(session, self.setup(route, persona, tool_filter, display));
            Ok((handle, provider, cwd))
        })();
        let outcome = match result {
            Ok((handle, provider, cwd)) => {
                self.install(child_id, handle, &caller.header.id, &provider, cwd);
                Ok(())
            }
            Err(e) => Err(e),
        };
        self.state().transitions.remove(child_id);
        outcome?;
        match self.submit(child_id, content, source) {
            Ok(id) => Ok(id),
            Err(e) => {
                self.abandon(child_id).await;
                Err(e)
            }
        }
    }

    /// `report`: the exact live continuable child sends content to its direct parent.
    pub fn report(self: &Arc<Self>, child_id: &str, output: &str) -> Result<String, SubagentError> {
        self.assert_admitting()?;
        let parent_id = self.state().activations.get(child_id).map(|a| a.parent_id.clone()).ok_or_else(|| {
            err(
                ErrorCode::Unauthorized,
                format!("agent \"{child_id}\" is not a live continuable subagent and cannot report"),
            )
        })?;
        let content = vec![
            json!({"type": "text", "text": format!("Background subagent {child_id} reported:")}),
            json!({"type": "text", "text": output}),
        ];
        let source = json!({"kind": "subagent-report", "senderSessionId": child_id});
        self.deliver(&parent_id, content, source, self.settings.report_delivery == ReportDelivery::Wakeup)
    }

    /// `interrupt_agent`: an ancestor cancels a descendant's current turn (its queue stays). A
    /// settled descendant is an accepted no-op; everything else is refused exactly as
    /// `send_message` refuses it (an invalid or unknown id, a live agent that is not a
    /// continuable child — the caller itself included — and another tree's session).
    pub fn interrupt(&self, caller_id: &str, target: &str) -> Result<(), SubagentError> {
        valid_target(target)?;
        let settling = {
            let state = self.state();
            if let Some(act) = state.activations.get(target) {
                let mut ancestor = Some(act.parent_id.as_str());
                for _ in 0..=state.activations.len() {
                    match ancestor {
                        Some(id) if id == caller_id => {
                            act.handle.cancel();
                            return Ok(());
                        }
                        Some(id) => ancestor = state.activations.get(id).map(|a| a.parent_id.as_str()),
                        None => break,
                    }
                }
                return Err(another_parent(target));
            }
            state.transitions.contains(target)
        };
        Self::authorize_stored(&*self.factory()?, caller_id, target, Reach::Descendant, settling).map(|_| ())
    }

    /// Shutdown: closes admission, cancels every Activation and disposes them child-first
    /// (deepest first), flushing each log. Child sessions survive on disk.
    pub async fn drain(self: &Arc<Self>) {
        self.draining.store(true, Ordering::SeqCst);
        let acts: Vec<(String, Activation)> = {
            let mut state = self.state();
            state.activations.drain().collect()
        };
        self.stop_child_first(acts).await;
    }

    /// `session/close` of a top-level session: cancels its continuable children and all their
    /// descendants and disposes them child-first, flushing each log. Other sessions' children
    /// are untouched and admission stays open. Child sessions survive on disk.
    pub async fn close_descendants(self: &Arc<Self>, root_id: &str) {
        let acts: Vec<(String, Activation)> = {
            let mut state = self.state();
            let below: Vec<String> = {
                let st: &State = &state;
                st.activations.keys().filter(|id| descends_from(st, id, root_id)).cloned().collect()
            };
            below.into_iter().filter_map(|id| state.activations.remove(&id).map(|act| (id, act))).collect()
        };
        self.stop_child_first(acts).await;
    }

    /// Cancels every Activation given, then shuts them down deepest first, releasing each and
    /// emitting its `subagent/end` (aborted).
    async fn stop_child_first(&self, mut acts: Vec<(String, Activation)>) {
        for (_, act) in &acts {
            act.handle.cancel();
        }
        let depth = |id: &str| {
            let mut d = 0;
            let mut cur = acts.iter().find(|(i, _)| i == id).map(|(_, a)| a.parent_id.clone());
            while let Some(p) = cur {
                d += 1;
                cur = acts.iter().find(|(i, _)| *i == p).map(|(_, a)| a.parent_id.clone());
            }
            d
        };
        let depths: HashMap<String, usize> = acts.iter().map(|(id, _)| (id.clone(), depth(id))).collect();
        acts.sort_by_key(|(id, _)| std::cmp::Reverse(depths.get(id).copied().unwrap_or(0)));
        for (id, act) in acts {
            // Shutdown (not flush first): a turn that had not started when it was cancelled is
            // cancelled by the shutdown command, which the actor reads in order.
            act.handle.shutdown().await;
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
            });
        }
    }
}

/// True when `root_id` is an ancestor of the Activation `id` (through live Activations).
fn descends_from(state: &State, id: &str, root_id: &str) -> bool {
    let mut parent = state.activations.get(id).map(|a| a.parent_id.as_str());
    for _ in 0..=state.activations.len() {
        match parent {
            Some(p) if p == root_id => return true,
            Some(p) => parent = state.activations.get(p).map(|a| a.parent_id.as_str()),
            None => return false,
        }
    }
    false
}

fn stop_reason(end: Option<&TurnEnd>) -> StopReason {
    match end {
        Some(TurnEnd::Completed) => StopReason::Completed,
        Some(TurnEnd::MaxTokens) => StopReason::MaxTokens,
        Some(TurnEnd::Aborted) => StopReason::Aborted,
        Some(TurnEnd::Disposed | TurnEnd::StepLimit(_) | TurnEnd::Error(_)) | None => StopReason::Error,
    }
}
