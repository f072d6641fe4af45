//! Session forwarding and the agent tree. Every session's events reach the client through a
//! `Forwarder`. When the client advertised `clientCapabilities.subagents` at `initialize` (ACP
//! subagent sessions; `unstable_subagents` in the 5.2 SDK), kin also shows the agent tree:
//! - every in-process child is announced on its parent session with `subagent_update` (title,
//!   description, `cancel` capability, cwd, state) before any update carrying the child's id,
//!   and its state follows its turns (`running`, then `idle` with the stop reason);
//! - the child's own updates are forwarded under the child's id (its own `Forwarder`);
//! - the parent's delegating tool call gets `{type: "session", sessionId}` content;
//! - a message from another session (the child's task, `send_message`, `report`, a settlement
//!   notice) appears as `session_message` in both transcripts, linked by message ids;
//! - a delegating call linked to a child gets no `tool/progress` updates (the child's session
//!   shows what they summarise).
//!
//! Without the capability none of this is sent and sessions forward exactly what they always did.
//! Every client gets a session's `usage_update` after each of its model calls, when the call's
//! route has a known context window (`size`; the schema has no way to leave it out).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, Cost, Error as SchemaError, ErrorStopReason, IdleStateUpdate, IdleStopReason, MessageId,
    RequiresActionStateUpdate, RunningStateUpdate, SessionCancelCapabilities, SessionId, SessionMessage,
    SessionNotification, SessionReference, SessionUpdate, StateUpdate, SubagentSessionCapabilities, SubagentUpdate,
    TextContent, ToolCallContent, ToolCallUpdate, ToolCallUpdateFields, UsageUpdate,
};
use serde_json::{Value, json};

use super::convert;
use crate::model::ModelRoute;
use crate::model::capacity::{ModelTable, Price};
use crate::runtime::{ChildObservers, ChildRecord, Runtime};
use crate::session::event::{self, TurnEndReason, UserMessage};
use crate::session::{Event, EventBody, Kind, Session, SessionHeader, SessionObserver};
use crate::subagent::catalog::{ListEntry, Reason, TreeEntry};
use crate::subagent::inprocess::{ChildDisplay, describe};
use crate::subagent::{Descriptor, child_title};
use crate::tools::ToolRegistry;

/// How deep a reloaded parent's stored children are followed.
const MAX_DEPTH: usize = 32;

/// What one connection knows about the agent tree, and the routes' context windows and prices
/// its usage updates report.
#[derive(Default)]
pub(super) struct Tree {
    /// Each route's context window and price.
    models: Arc<ModelTable>,
    /// The client advertised `clientCapabilities.subagents` at `initialize`.
    enabled: AtomicBool,
    /// (parent session, delegating tool call) → the child it started, until the call's result.
    links: Mutex<HashMap<(String, String), String>>,
}

impl Tree {
    /// A tree whose usage updates take windows and prices from `models`.
    pub(super) fn new(models: Arc<ModelTable>) -> Self {
        Tree { models, ..Tree::default() }
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    pub(super) fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::SeqCst);
    }

    fn links(&self) -> MutexGuard<'_, HashMap<(String, String), String>> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn link(&self, parent: &str, call: &str, child: &str) {
        self.links().insert((parent.to_string(), call.to_string()), child.to_string());
    }

    /// Whether a tool call started a child that is still linked.
    fn linked(&self, parent: &str, call: &str) -> bool {
        self.links().contains_key(&(parent.to_string(), call.to_string()))
    }

    /// The child a tool call started, forgotten once asked for (call ids may repeat later).
    fn take_link(&self, parent: &str, call: &str) -> Option<String> {
        self.links().remove(&(parent.to_string(), call.to_string()))
    }
}

/// Sends one `session/update`; a closed connection drops it.
pub(super) fn notify(cx: &ConnectionTo<Client>, session: &str, update: SessionUpdate) {
    let notification = SessionNotification::new(session.to_string(), update);
    if let Err(e) = crate::outflow::outflow().send(|| cx.send_notification(notification)) {
        tracing::debug!("dropping a session update: {e}");
    }
}

/// A session's model usage: totals over its own model calls (its compactions' summary calls
/// too), what its context holds now (the last call's input plus output tokens, less what a
/// compaction since shadowed, plus its checkpoint), and the cost of the calls on priced routes.
#[derive(Default)]
struct Usage {
    input: u64,
    output: u64,
    calls: u64,
    context: u64,
    /// Dollars, when some call was on a priced route.
    cost: Option<f64>,
}

impl Usage {
    /// Adds the `usage` of an `assistant/message`, if it has one (priced at `price`); true if
    /// it had.
    fn add(&mut self, usage: Option<&Value>, price: Option<Price>) -> bool {
        let Some((input, output)) = self.total(usage, price) else {
            return false;
        };
        self.context = input + output;
        true
    }

    /// Adds a compaction: its summary call to the totals (its size is not what the context
    /// holds), and the context less what it shadowed, plus the checkpoint that replaced it.
    fn compacted(&mut self, summary: &event::CompactSummary, price: Option<Price>) {
        self.total(summary.usage.as_ref(), price);
        let checkpoint = crate::agent::compact::checkpoint_tokens(&summary.summary);
        self.context = self.context.saturating_sub(summary.shadowed_token_count) + checkpoint;
    }

    /// Adds a call's `usage` (priced at `price`) to the totals: its input and output tokens, or
    /// `None` when it has none.
    fn total(&mut self, usage: Option<&Value>, price: Option<Price>) -> Option<(u64, u64)> {
        let usage = usage.filter(|u| u.is_object())?;
        let input = usage["inputTokens"].as_u64().unwrap_or(0);
        let output = usage["outputTokens"].as_u64().unwrap_or(0);
        self.input += input;
        self.output += output;
        self.calls += 1;
        if let Some(price) = price {
            self.cost = Some(self.cost.unwrap_or(0.0) + price.cost(input, output));
        }
        Some((input, output))
    }

    /// `usage_update`: `used` is the last call's input plus output tokens, `size` the route's
    /// context window, `cost` the dollars so far (when some call was priced), and `_meta.kin`
    /// the session's totals.
    fn update(&self, size: u64) -> SessionUpdate {
        let mut meta = serde_json::Map::new();
        meta.insert(
            "kin".into(),
            json!({"inputTokens": self.input, "outputTokens": self.output, "modelCalls": self.calls}),
        );
        let mut update = UsageUpdate::new(self.context, size).meta(meta);
        if let Some(amount) = self.cost {
            update = update.cost(Cost::new(amount, "USD"));
        }
        SessionUpdate::UsageUpdate(update)
    }
}

#[derive(Default)]
struct State {
    usage: Usage,
    /// The context window of the route of the last model answer counted (the meter's size).
    window: Option<u64>,
    /// A child's last announced state was `running`.
    running: bool,
}

impl State {
    /// Counts a model answer or a compaction (`models` tells their routes' prices and windows);
    /// the `usage_update` the meter then shows, when the session's window is known.
    fn count(&mut self, body: &EventBody, models: &ModelTable) -> Option<SessionUpdate> {
        match body {
            EventBody::AssistantMessage(message) => {
                let info = models.info(&route_of(message));
                if !self.usage.add(message.usage.as_ref(), info.price) {
                    return None;
                }
                self.window = info.context_window;
            }
            EventBody::CompactSummary(summary) => {
                let route = ModelRoute { provider: summary.provider.clone(), model: summary.model.clone() };
                self.usage.compacted(summary, models.info(&route).price);
            }
            _ => return None,
        }
        self.window.map(|size| self.usage.update(size))
    }
}

/// Forwards a session's events to the client as `session/update` notifications: a top-level
/// session's, or (agent tree) a child's, whose parent it knows.
pub(super) struct Forwarder {
    cx: ConnectionTo<Client>,
    tree: Arc<Tree>,
    /// How the session's tool calls are shown.
    tools: ToolRegistry,
    /// The parent of a child session.
    parent: Option<String>,
    state: Mutex<State>,
}

impl Forwarder {
    /// The forwarder of a top-level session whose tool calls are shown as `tools` says.
    pub(super) fn new(cx: ConnectionTo<Client>, tree: Arc<Tree>, tools: ToolRegistry) -> Self {
        Forwarder { cx, tree, tools, parent: None, state: Mutex::default() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts the model usage a loaded log already holds (after any lineage seed); returns the
    /// `usage_update` the client's context meter shows again (as it stood after the last call
    /// counted, when that call's route has a known window).
    pub(super) fn count(&self, events: &[Event]) -> Option<SessionUpdate> {
        let own = events.iter().position(|e| e.kind == Kind::SessionEndSeed).map_or(0, |i| i + 1);
        let mut state = self.state();
        let counted = [Kind::AssistantMessage, Kind::CompactSummary];
        for event in events[own..].iter().filter(|e| counted.contains(&e.kind)) {
            state.count(&event.body(), &self.tree.models);
        }
        state.window.map(|size| state.usage.update(size))
    }

    fn send(&self, session: &str, update: SessionUpdate) {
        notify(&self.cx, session, update);
    }

    /// Adds the session link to the result (not a progress report) of a tool call that started
    /// a child.
    fn link_result(&self, session: &str, update: &mut SessionUpdate) {
        if let SessionUpdate::ToolCallUpdate(call) = update
            && call.fields.status.is_some()
            && let Some(child) = self.tree.take_link(session, &call.tool_call_id.0)
        {
            call.fields
                .content
                .get_or_insert_with(Vec::new)
                .push(ToolCallContent::Session(SessionReference::new(child)));
        }
    }

    /// A message from another session (the child's task from its parent, `send_message`,
    /// `report`, a settlement notice) as `session_message` in both transcripts: the incoming view
    /// here (message id = the user message's id), the outgoing view in the sender's
    /// (`<id>.sent`), each naming the other's id.
    fn message(&self, header: &SessionHeader, message: &UserMessage) {
        let source = &message.source;
        let sender = match source["senderSessionId"].as_str() {
            Some(sender) => sender.to_string(),
            None if source["kind"] == "user" => match &self.parent {
                Some(parent) => parent.clone(),
                None => return,
            },
            None => return,
        };
        let id = message.id.as_str();
        if id.is_empty() {
            return;
        }
        let content: Vec<ContentBlock> = message
            .content
            .iter()
            .filter_map(|b| b["text"].as_str())
            .map(|t| ContentBlock::Text(TextContent::new(t)))
            .collect();
        let sent = format!("{id}.sent");
        let incoming = SessionMessage::new(MessageId::new(id))
            .sender_session_id(SessionId::new(sender.as_str()))
            .recipient_session_id(SessionId::new(header.id.as_str()))
            .sender_message_id(MessageId::new(sent.as_str()))
            .content(content.clone());
        let outgoing = SessionMessage::new(MessageId::new(sent.as_str()))
            .sender_session_id(SessionId::new(sender.as_str()))
            .recipient_session_id(SessionId::new(header.id.as_str()))
            .recipient_message_id(MessageId::new(id))
            .content(content);
        self.send(&header.id, SessionUpdate::SessionMessage(incoming));
        self.send(&sender, SessionUpdate::SessionMessage(outgoing));
    }
}

impl SessionObserver for Forwarder {
    fn on_event(&self, header: &SessionHeader, event: &Event) {
        let body = event.body();
        let tree = self.tree.enabled();
        if tree
            && let EventBody::TurnStart(_) = &body
            && let Some(parent) = &self.parent
        {
            let was_running = {
                let mut state = self.state();
                std::mem::replace(&mut state.running, true)
            };
            if !was_running {
                let update = SubagentUpdate::new(header.id.clone()).state(running());
                self.send(parent, SessionUpdate::SubagentUpdate(update));
            }
        }
        // A client that shows the child's own session needs no progress on the delegating call.
        let shown_as_child =
            tree && matches!(&body, EventBody::ToolProgress(p) if self.tree.linked(&header.id, &p.call_id));
        if let Some(mut update) =
            convert::live_update(&body, &self.tools, &convert::cwd_of(header)).filter(|_| !shown_as_child)
        {
            if tree {
                self.link_result(&header.id, &mut update);
            }
            self.send(&header.id, update);
        }
        // Every client hears the usage after each model call and each compaction, when the
        // session's window is known.
        let update = self.state().count(&body, &self.tree.models);
        if let Some(update) = update {
            self.send(&header.id, update);
        }
        if !tree {
            return;
        }
        match &body {
            EventBody::UserMessage(message) => self.message(header, message),
            EventBody::TurnEnd(end) => {
                self.state().running = false;
                if let Some(parent) = &self.parent {
                    let update = SubagentUpdate::new(header.id.clone()).state(idle_after(&end.reason));
                    self.send(parent, SessionUpdate::SubagentUpdate(update));
                }
            }
            EventBody::TurnStart(_)
            | EventBody::AssistantMessage(_)
            | EventBody::SteeringMessage(_)
            | EventBody::StepStart(_)
            | EventBody::AssistantChunk(_)
            | EventBody::ToolCall(_)
            | EventBody::ToolProgress(_)
            | EventBody::ToolResult(_)
            | EventBody::StepEnd(_)
            | EventBody::LlmRetry(_)
            | EventBody::SystemPrompt(_)
            | EventBody::TodoWrite(_)
            | EventBody::SessionMode(_)
            | EventBody::SessionModel(_)
            | EventBody::SessionSandbox(_)
            | EventBody::McpServers(_)
            | EventBody::SessionEndSeed(_)
            | EventBody::SubagentDescriptor(_)
            | EventBody::SubagentRemoteRun(_)
            | EventBody::AgentInboxSpliced(_)
            | EventBody::CompactStart(_)
            | EventBody::CompactSummary(_)
            | EventBody::CompactEnd(_)
            | EventBody::SessionTitle(_)
            | EventBody::Unknown { .. } => {}
        }
    }
}

/// The route that wrote a model message.
fn route_of(message: &event::AssistantMessage) -> ModelRoute {
    let source = &message.message.source;
    ModelRoute { provider: source.provider.clone(), model: source.model.clone() }
}

/// Makes the forwarder of each child session, announcing the child on its parent (running) and
/// linking the parent's delegating tool call to it.
pub(super) struct ChildForwarders {
    pub cx: ConnectionTo<Client>,
    pub tree: Arc<Tree>,
    /// How the children's tool calls are shown.
    pub tools: ToolRegistry,
}

impl ChildObservers for ChildForwarders {
    fn child_observer(&self, session: &Session, display: &ChildDisplay) -> Arc<dyn SessionObserver> {
        let header = &session.header;
        let forwarder = Forwarder {
            cx: self.cx.clone(),
            tree: self.tree.clone(),
            tools: self.tools.clone(),
            parent: header.parent_session.clone(),
            state: Mutex::new(State { running: true, ..State::default() }),
        };
        forwarder.count(session.events());
        if let Some(parent) = &header.parent_session {
            let update = announcement(header, display.title.clone(), display.description.clone(), running());
            forwarder.send(parent, SessionUpdate::SubagentUpdate(update));
            if let Some(call) = &display.call_id {
                self.tree.link(parent, call, &header.id);
                let link = ToolCallContent::Session(SessionReference::new(header.id.clone()));
                let fields = ToolCallUpdateFields::new().content(vec![link]);
                forwarder.send(parent, SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(call.clone(), fields)));
            }
        }
        Arc::new(forwarder)
    }
}

/// A full `subagent_update` for a child: identity, display, `cancel` capability, cwd and state.
fn announcement(
    header: &SessionHeader,
    title: Option<String>,
    description: Option<String>,
    state: StateUpdate,
) -> SubagentUpdate {
    let mut update = SubagentUpdate::new(header.id.clone())
        .capabilities(SubagentSessionCapabilities::new().cancel(SessionCancelCapabilities::new()))
        .state(state);
    if let Some(title) = title {
        update = update.title(title);
    }
    if let Some(description) = description {
        update = update.description(description);
    }
    if let Some(cwd) = &header.cwd {
        update = update.cwd(PathBuf::from(cwd));
    }
    update
}

/// Tells the editor a child waits on the user (`requires_action`), or works again (`running`).
pub(super) fn waiting_on_user(cx: &ConnectionTo<Client>, parent: &str, child: &str, waiting: bool) {
    let state = if waiting { StateUpdate::RequiresAction(RequiresActionStateUpdate::new()) } else { running() };
    notify(cx, parent, SessionUpdate::SubagentUpdate(SubagentUpdate::new(child.to_string()).state(state)));
}

fn running() -> StateUpdate {
    StateUpdate::Running(RunningStateUpdate::new())
}

fn idle(stop: Option<IdleStopReason>) -> StateUpdate {
    StateUpdate::Idle(IdleStateUpdate::new().stop_reason(stop))
}

/// The state after a live turn ended with this `turn/end` reason.
fn idle_after(reason: &TurnEndReason) -> StateUpdate {
    let stop = match reason {
        TurnEndReason::Error { failure, .. } => {
            let message = failure.as_ref().map_or("the turn failed", |f| f.message.as_str());
            Some(IdleStopReason::Error(ErrorStopReason::new().error(SchemaError::new(-32603, message))))
        }
        other => clean_stop(other),
    };
    idle(stop)
}

/// The stop reason of a turn that ended cleanly; `None` for a failed, interrupted or unknown end.
fn clean_stop(reason: &TurnEndReason) -> Option<IdleStopReason> {
    match reason {
        TurnEndReason::Completed => Some(IdleStopReason::EndTurn),
        TurnEndReason::MaxTokens => Some(IdleStopReason::MaxTokens),
        TurnEndReason::Aborted | TurnEndReason::Disposed => Some(IdleStopReason::Cancelled),
        TurnEndReason::Error { .. } | TurnEndReason::Interrupted | TurnEndReason::Unrecognized => None,
    }
}

/// The state of a stored child: `running` while a turn of its live agent runs, else `idle`, with
/// the stop reason of its last turn when that turn ended cleanly. A turn that failed, was
/// interrupted by a crash or is still open gives no stop reason: a reloaded child is never
/// reported as failed. Nothing is repaired, so repeated loads give the same answer.
fn stored_state(record: &ChildRecord) -> StateUpdate {
    if record.running {
        return running();
    }
    let events = &record.events;
    let start = events.iter().rposition(|e| e.kind == Kind::TurnStart);
    let end = events.iter().rposition(|e| e.kind == Kind::TurnEnd);
    let stop = match (start, end) {
        (Some(start), Some(end)) if end > start => {
            events[end].get::<event::TurnEnd>().and_then(|end| clean_stop(&end.reason))
        }
        _ => None,
    };
    idle(stop)
}

/// A stored child of a reloaded parent, with its own children.
pub(super) struct Node {
    parent: String,
    shown: Shown,
    children: Vec<Node>,
}

/// What the editor is shown of a listed child.
enum Shown {
    Child(Box<ChildRecord>),
    /// A candidate `list_agents` reports as a diagnostic: shown as such, never hidden.
    Diagnostic {
        id: String,
        reason: Reason,
    },
}

/// The stored children below `parent`, as `list_agents` lists them (the catalog's candidates,
/// order, activity and diagnostics), at every level; a listing that fails as a whole is logged
/// and shows no tree (the load itself goes on).
pub(super) fn stored_tree(runtime: &Runtime, parent: &str) -> Vec<Node> {
    match runtime.child_tree(parent, MAX_DEPTH) {
        Ok(entries) => nodes(runtime, parent, entries),
        Err(e) => {
            tracing::warn!(session = %parent, "the agent tree cannot be listed: {e}");
            Vec::new()
        }
    }
}

fn nodes(runtime: &Runtime, parent: &str, entries: Vec<TreeEntry>) -> Vec<Node> {
    entries
        .into_iter()
        .map(|TreeEntry { entry, children }| {
            let shown = match entry {
                ListEntry::Child { id, activity, .. } => match runtime.child_record(&id, activity) {
                    Some(record) => Shown::Child(Box::new(record)),
                    None => Shown::Diagnostic { id, reason: Reason::Unavailable },
                },
                ListEntry::Diagnostic { id, reason } => Shown::Diagnostic { id, reason },
            };
            let id = match &shown {
                Shown::Child(record) => record.header.id.clone(),
                Shown::Diagnostic { id, .. } => id.clone(),
            };
            Node { parent: parent.to_string(), shown, children: nodes(runtime, &id, children) }
        })
        .collect()
}

/// Announces a stored child on its parent: title from its descriptor's label (`<agent>: <label>`
/// for a named agent), description from its task, and its stored state. A diagnostic is
/// announced with its reason as the title and an `idle` state whose error says why its history
/// is not shown.
fn announce(cx: &ConnectionTo<Client>, node: &Node) {
    let update = match &node.shown {
        Shown::Child(record) => {
            let title =
                record.descriptor.as_ref().and_then(|d| child_title(d.agent().map(|a| a.name.as_str()), d.label()));
            let task = record.events.iter().filter_map(Event::get::<UserMessage>).find(UserMessage::is_from_user);
            let description = task.and_then(|m| describe(&m.content));
            announcement(&record.header, title, description, stored_state(record))
        }
        Shown::Diagnostic { id, reason } => diagnostic_announcement(id, *reason),
    };
    notify(cx, &node.parent, SessionUpdate::SubagentUpdate(update));
}

/// The announcement of a child that cannot be shown: `subagent session <reason>`, idle with an
/// error naming the reason.
fn diagnostic_announcement(id: &str, reason: Reason) -> SubagentUpdate {
    let message = format!("subagent session {id} is {}; its history is not shown", reason.as_str());
    let stop = IdleStopReason::Error(ErrorStopReason::new().error(SchemaError::new(-32603, message)));
    SubagentUpdate::new(id.to_string()).title(format!("subagent session {}", reason.as_str())).state(idle(Some(stop)))
}

/// The best-effort replay of a reloaded parent's children, before the load response, parent
/// first: each child is announced on its parent, then its own history is replayed under its id.
pub(super) fn replay(cx: &ConnectionTo<Client>, tools: &ToolRegistry, nodes: &[Node]) {
    for node in nodes {
        announce(cx, node);
        if let Shown::Child(record) = &node.shown {
            let cwd = convert::cwd_of(&record.header);
            for update in record.events.iter().flat_map(|e| convert::replay_updates(&e.body(), tools, &cwd)) {
                notify(cx, &record.header.id, update);
            }
        }
        replay(cx, tools, &node.children);
    }
}

/// After the load (or resume) response: re-announces every child that is live or can be resumed
/// (a continuable child), each after its ancestors.
pub(super) fn reannounce(cx: &ConnectionTo<Client>, nodes: &[Node]) {
    for node in nodes {
        if !continuing(node) {
            continue;
        }
        announce(cx, node);
        reannounce(cx, &node.children);
    }
}

/// True when the child, or a child below it, is live or continuable.
fn continuing(node: &Node) -> bool {
    let this = match &node.shown {
        Shown::Child(record) => record.live || matches!(record.descriptor, Some(Descriptor::Continuable { .. })),
        Shown::Diagnostic { .. } => false,
    };
    this || node.children.iter().any(continuing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_serialize_as_the_protocol_says() {
        let wire = serde_json::to_value(idle_after(&TurnEndReason::Completed)).unwrap();
        assert_eq!(wire, json!({"state": "idle", "stopReason": "end_turn"}));
        let wire = serde_json::to_value(idle_after(&TurnEndReason::Aborted)).unwrap();
        assert_eq!(wire, json!({"state": "idle", "stopReason": "cancelled"}));
        let failure = Some(crate::model::Failure::new("boom", "X"));
        let wire = serde_json::to_value(idle_after(&TurnEndReason::Error { step: 1, failure })).unwrap();
        assert_eq!(wire["stopReason"], "error");
        assert_eq!(wire["error"]["message"], "boom");
        let wire = serde_json::to_value(idle_after(&TurnEndReason::Interrupted)).unwrap();
        assert_eq!(wire, json!({"state": "idle"}));
        assert_eq!(serde_json::to_value(running()).unwrap(), json!({"state": "running"}));
    }

    #[test]
    fn an_announcement_carries_identity_display_cancel_and_cwd() {
        let mut header = SessionHeader::new("child-1", 0, Some("/w".into()));
        header.parent_session = Some("parent-1".into());
        let update = announcement(&header, Some("Title".into()), None, running());
        let wire = serde_json::to_value(SessionUpdate::SubagentUpdate(update)).unwrap();
        assert_eq!(
            wire,
            json!({
                "sessionUpdate": "subagent_update",
                "sessionId": "child-1",
                "title": "Title",
                "capabilities": {"cancel": {}},
                "state": {"state": "running"},
                "cwd": "/w",
            })
        );
    }

    #[test]
    fn usage_counts_every_call_and_keeps_the_last_context() {
        let mut usage = Usage::default();
        assert!(usage.add(Some(&json!({"inputTokens": 20, "outputTokens": 10})), None));
        assert!(!usage.add(None, None));
        assert!(usage.add(Some(&json!({"inputTokens": 30, "outputTokens": 2})), None));
        let wire = serde_json::to_value(usage.update(128_000)).unwrap();
        assert_eq!(wire["sessionUpdate"], "usage_update");
        assert_eq!((wire["used"].as_u64(), wire["size"].as_u64()), (Some(32), Some(128_000)));
        assert_eq!(wire["_meta"]["kin"], json!({"inputTokens": 50, "outputTokens": 12, "modelCalls": 2}));
        assert!(wire.get("cost").is_none_or(Value::is_null), "no price, no cost: {wire}");
        // A priced call adds its cost: 1M input at $2 and 100k output at $10.
        let price = Price { input_per_mtok: 2.0, output_per_mtok: 10.0 };
        usage.add(Some(&json!({"inputTokens": 1_000_000, "outputTokens": 100_000})), Some(price));
        let wire = serde_json::to_value(usage.update(128_000)).unwrap();
        assert_eq!(wire["cost"], json!({"amount": 3.0, "currency": "USD"}));
    }

    #[test]
    fn a_compaction_counts_its_summary_call_and_moves_the_meter() {
        let mut usage = Usage::default();
        usage.add(Some(&json!({"inputTokens": 11_000, "outputTokens": 74})), None);
        let summary = event::CompactSummary {
            summary: vec![json!({"type": "text", "text": "What happened so far."})],
            raw_output: None,
            shadowed_range: event::SeqRange { start: 1, end: 9 },
            shadowed_seqs: (1..=9).collect(),
            shadowed_token_count: 7_000,
            provider: "p".into(),
            model: "m".into(),
            max_tokens: None,
            usage: Some(json!({"inputTokens": 11_500, "outputTokens": 100})),
        };
        let price = Price { input_per_mtok: 1.0, output_per_mtok: 1.0 };
        usage.compacted(&summary, Some(price));
        let checkpoint = crate::agent::compact::checkpoint_tokens(&summary.summary);
        let wire = serde_json::to_value(usage.update(20_000)).unwrap();
        assert_eq!(
            wire["used"].as_u64(),
            Some(11_074 - 7_000 + checkpoint),
            "less what it shadowed, plus the checkpoint"
        );
        assert_eq!(wire["_meta"]["kin"], json!({"inputTokens": 22_500, "outputTokens": 174, "modelCalls": 2}));
        assert_eq!(wire["cost"], json!({"amount": 0.0116, "currency": "USD"}), "the summary call is paid for");
    }
}
