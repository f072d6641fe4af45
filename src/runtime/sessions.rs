//! The life of a top-level session: new, start (restoring its mode, model and sandbox), fork,
//! close, delete, shutdown; its MCP servers; new session ids.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;

use super::agents::{Agent, Node, Role, TopLevel};
use super::error::{RuntimeError, store_error};
use super::{Runtime, SessionView};
use crate::agent::{Restored, spawn_restored};
use crate::mcp::{McpNotice, McpSession, ServerSpec};
use crate::permission::{PermissionMode, Permissions};
use crate::prompt::{self};
use crate::sandbox::{SandboxPolicy, SessionSandbox};
use crate::session::event;
use crate::session::{Session, SessionHeader, SessionObserver, now_ms};
use crate::subagent::agents::Agents;

impl Runtime {
    /// Creates a top-level session in `cwd` (absolute) with the config's MCP servers and starts
    /// its agent.
    pub fn new_session(&self, cwd: &Path, observer: Arc<dyn SessionObserver>) -> Result<String, RuntimeError> {
        self.new_session_with(cwd, observer, Vec::new()).map(|view| view.id)
    }

    /// `new_session` with the editor's MCP servers (which replace config servers of the same name).
    pub(crate) fn new_session_with(
        &self,
        cwd: &Path,
        observer: Arc<dyn SessionObserver>,
        servers: Vec<ServerSpec>,
    ) -> Result<SessionView, RuntimeError> {
        check_cwd(cwd)?;
        let cwd = &crate::session::layout::workspace(cwd);
        let (system, record) = self.session_prompt(cwd)?;
        let id = self.mint_session_id();
        let header = SessionHeader::new(id, now_ms(), Some(cwd.display().to_string()));
        let mut session = self.store.create(header).map_err(|e| RuntimeError::Internal(e.to_string()))?;
        if record {
            session.push(event::SystemPrompt { text: system.clone() });
        }
        self.publish(session, system, servers, observer)
    }

    /// Makes a just-created top-level session live (`new_session`, `fork_session`): records its
    /// MCP servers, writes its log (a log that cannot be written is discarded: the session never
    /// existed, and none of its servers starts), starts its MCP servers, attaches `observer` and
    /// starts its agent; returns its view.
    fn publish(
        &self,
        mut session: Session,
        system: String,
        servers: Vec<ServerSpec>,
        observer: Arc<dyn SessionObserver>,
    ) -> Result<SessionView, RuntimeError> {
        let specs = self.record_mcp(&mut session, servers);
        // The session exists on disk before the client learns its id, and before its MCP servers
        // start (a session that never existed leaves no server running).
        if let Err(e) = session.flush() {
            session.discard();
            return Err(RuntimeError::Internal(format!("cannot create the session log: {e:#}")));
        }
        let mcp = self.start_mcp(&session, specs);
        session.add_observer(observer);
        let id = session.id().to_string();
        self.start(session, system, mcp, Restored::none());
        Ok(self.view(&id))
    }

    /// Starts a session's MCP servers (the config's, each replaced by the editor's server of the
    /// same name), and records which ones it has when it has any or had some.
    pub(super) fn mcp_for(&self, session: &mut Session, editor: Vec<ServerSpec>) -> Arc<McpSession> {
        let specs = self.record_mcp(session, editor);
        self.start_mcp(session, specs)
    }

    /// The MCP servers a session gets (the config's, each replaced by the editor's server of the
    /// same name), recorded in its log when it has any or had some.
    fn record_mcp(&self, session: &mut Session, editor: Vec<ServerSpec>) -> Vec<ServerSpec> {
        let specs = crate::mcp::merge(&self.config.mcp_servers, editor);
        let had = session.events().iter().any(|e| e.kind == crate::session::Kind::McpServers);
        if !specs.is_empty() || had {
            session.push(McpSession::describe(&specs));
        }
        specs
    }

    /// Starts `specs` as `session`'s MCP servers, in its working directory.
    fn start_mcp(&self, session: &Session, specs: Vec<ServerSpec>) -> Arc<McpSession> {
        let cwd = session.header.cwd.clone().map(Into::into);
        McpSession::start(specs, cwd, self.config.mcp, self.mcp_recording.clone())
    }

    /// The notices of a live session's MCP servers (once: whoever tells the user takes them).
    pub fn take_mcp_notices(&self, session_id: &str) -> Option<tokio::sync::mpsc::UnboundedReceiver<McpNotice>> {
        self.agents.top_level(session_id).and_then(|(_, top)| top.mcp.take_notices())
    }

    /// Starts the agent of a top-level session. A session whose log (or fork seed) records a
    /// mode chosen with `session/set_mode` gets it back, but never one more permissive than the
    /// mode kin was started in; one that records a model chosen in the editor gets that route.
    /// `restored` turns wait for `run_restored`.
    pub(super) fn start(
        &self,
        session: crate::session::Session,
        system: String,
        mcp: Arc<McpSession>,
        restored: Restored,
    ) {
        let id = session.id().to_string();
        let ceiling = self.config.permission_mode;
        let mode = match event::last::<event::SessionMode>(session.events())
            .and_then(|m| PermissionMode::parse(&m.mode))
        {
            Some(mode) if mode.capped_at(ceiling) != mode => {
                tracing::info!(session = %id, recorded = mode.id(), mode = ceiling.id(), "restoring the session in the mode kin was started in, not its more permissive recorded one");
                ceiling
            }
            Some(mode) => mode,
            None => ceiling,
        };
        let route = event::last::<event::SessionModel>(session.events())
            .map(|m| crate::model::ModelRoute { provider: m.provider, model: m.model })
            .unwrap_or_else(|| self.config.model.clone());
        let permissions = Arc::new(Permissions::new(mode));
        // The session's named agents: its workspace's files over the config's and the user's.
        let agents = Arc::new(Agents::load(&self.config.agents, session.header.cwd.as_deref().map(Path::new)));
        // A sandbox chosen before a restart stays chosen, unless kin was started stricter.
        let chosen = event::last::<event::SandboxChoice>(session.events()).and_then(|c| SessionSandbox::from_event(&c));
        // Judged by the mode kin was started in: the session's may be raised back to it.
        let recorded = restorable_sandbox(chosen, self.sandbox_settings.policy, ceiling);
        if let (Some(dropped), None) = (chosen, recorded) {
            tracing::info!(session = %id, recorded = %dropped, "restoring the session without its sandbox: kin was started without one, where every command asks");
        }
        let sandbox = Arc::new(SessionSandbox::restored(self.sandbox_settings.clone(), recorded));
        let workspace = session.header.cwd.clone();
        let mut deps = self.deps(&permissions, &mcp, &agents, &sandbox, workspace.as_deref(), system);
        deps.route = route;
        let cwd = session.header.cwd.as_deref().map(PathBuf::from);
        let handle = spawn_restored(session, restored, deps);
        let top = TopLevel { permissions, mcp, named: agents, sandbox, cwd };
        self.agents.insert(id, Agent { handle, role: Role::TopLevel(Arc::new(top)) }, None);
    }

    /// A new top-level session's system prompt, and whether to record it: the fixture's pinned
    /// prompt (recorded), else the built prompt (recorded, except under a fixture, where it
    /// would make transcripts depend on the date).
    pub(super) fn session_prompt(&self, cwd: &Path) -> Result<(String, bool), RuntimeError> {
        if let Some(text) = self.fixture.as_ref().and_then(|f| f.pinned_prompt(cwd)) {
            return Ok((text, true));
        }
        let built = self
            .build_prompt(Some(cwd), &self.tools, self.config.persona.as_deref(), self.config.permission_mode)
            .map_err(RuntimeError::Internal)?;
        Ok((built, self.fixture.is_none()))
    }

    /// A new session id: the fixture's pinned id (replay) unless already used, else a UUID.
    pub(super) fn mint_session_id(&self) -> String {
        while let Some(id) = self.fixture.as_ref().and_then(|f| f.next_session_id()) {
            if matches!(self.store.locate(&id), Ok(None)) && !self.agents.is_top_level(&id) {
                return id;
            }
        }
        uuid::Uuid::new_v4().to_string()
    }

    /// Closes a live top-level session (`session/close`): drains its continuable children through
    /// the continuation manager, stops every other child below it, then stops its agent
    /// (cancelling a running turn, whose prompt answers `cancelled`), flushes its log and frees
    /// it. The session stays on disk and can be loaded again. It is closed either way; when its
    /// log (or that of a child it stopped) could not be written at the end, the answer is an
    /// error naming the cause: what was not written is lost, and a later load shows the session
    /// as it was last written.
    pub async fn close_session(self: &Arc<Self>, session_id: &str) -> Result<(), RuntimeError> {
        self.begin_close(session_id)?.finish().await
    }

    /// The part of `close_session` done as its request is read, before anything after it: the
    /// session is no longer live (a prompt for it is told it is unknown) and its turn is stopped;
    /// a load or resume of it waits on its gate, and a delete is refused, until `finish` has
    /// closed its log.
    pub(crate) fn begin_close(self: &Arc<Self>, session_id: &str) -> Result<Closing, RuntimeError> {
        self.reject_child(session_id)?;
        let removed = self.agents.remove_if(session_id, Agent::is_top_level);
        let Some((handle, top)) = removed.ok().flatten().and_then(|a| Some((a.handle.clone(), a.top_level()?.clone())))
        else {
            return Err(self.not_live(session_id));
        };
        handle.stop();
        let gate = self.load_gate(session_id);
        let held = gate.clone().try_lock_owned().ok();
        self.closing.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(session_id.to_string());
        Ok(Closing { runtime: self.clone(), id: session_id.to_string(), handle, top, gate: Some(gate), held })
    }

    /// Whether a `session/close` of `session_id` was read and has not finished.
    pub(super) fn is_closing(&self, session_id: &str) -> bool {
        self.closing.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(session_id)
    }

    /// The rest of `close_session` (see `begin_close`).
    async fn finish_close(
        &self,
        session_id: &str,
        handle: crate::agent::AgentHandle,
        top: Arc<TopLevel>,
    ) -> Result<(), RuntimeError> {
        let mut unsaved = self.continuation.close_descendants(session_id).await;
        for (id, handle) in self.descendants(session_id) {
            if let Err(e) = handle.dispose().await {
                unsaved.push(format!("subagent {id}: {e}"));
            }
            self.agents.remove(&id);
        }
        if let Err(e) = handle.dispose().await {
            unsaved.push(e);
        }
        top.mcp.close().await;
        if unsaved.is_empty() {
            return Ok(());
        }
        Err(RuntimeError::Internal(format!(
            "session {session_id} is closed, but not everything of it could be saved: {}. What was not written is lost; loading the session again shows it as it was last written",
            unsaved.join("; ")
        )))
    }

    /// Forks a top-level session (`session/fork`): a new top-level session in `cwd` seeded with
    /// the source's completed turns as they are on disk (the prompt it was created with comes
    /// along), in the source's recorded mode and model as `start` restores them. Returns the new
    /// session's view.
    pub(crate) fn fork_session(
        &self,
        source_id: &str,
        cwd: &Path,
        observer: Arc<dyn SessionObserver>,
        servers: Vec<ServerSpec>,
    ) -> Result<SessionView, RuntimeError> {
        self.reject_child(source_id)?;
        check_cwd(cwd)?;
        let cwd = &crate::session::layout::workspace(cwd);
        let source = self.store.inspect(source_id).map_err(store_error)?;
        let seed = crate::agent::completed_prefix(&source.events).to_vec();
        let system = match prompt::recorded(&seed) {
            Some(text) => text,
            None => self
                .build_prompt(Some(cwd), &self.tools, self.config.persona.as_deref(), self.config.permission_mode)
                .map_err(RuntimeError::Internal)?,
        };
        let id = self.mint_session_id();
        let mut header = SessionHeader::new(id, now_ms(), Some(cwd.display().to_string()));
        header.seed_length = (!seed.is_empty()).then_some(seed.len() as u64);
        let session = self.store.create_seeded(header, seed).map_err(|e| RuntimeError::Internal(e.to_string()))?;
        // The fork has read what its seed read, where the source ran it.
        let source_cwd = source.header.cwd.as_deref().map(Path::new).unwrap_or(Path::new(""));
        self.tools.restore(session.id(), source_cwd, session.events());
        self.publish(session, system, servers, observer)
    }

    /// Deletes a stored top-level session and its subagent sessions (`session/delete`): refused
    /// for a child id, a session live here (close it first) and one whose log another kin writes.
    /// The logs are gone from disk when it returns.
    pub fn delete_session(&self, session_id: &str) -> Result<(), RuntimeError> {
        self.reject_child(session_id)?;
        if self.agents.is_top_level(session_id) {
            return Err(RuntimeError::InvalidParams(format!(
                "session {session_id} is open; close it (session/close) before deleting it"
            )));
        }
        if self.is_closing(session_id) {
            return Err(RuntimeError::InvalidParams(format!(
                "session {session_id} is being closed; send session/delete once session/close has answered"
            )));
        }
        // Not while it is being loaded or resumed (the load would find it gone, or hold its log):
        // from the moment that request was read (`opening`), not only once the load holds the gate.
        if self.being_opened(session_id) {
            return Err(being_loaded(session_id));
        }
        let gate = self.load_gate(session_id);
        let removed = match gate.try_lock() {
            Ok(_loads) => self.store.delete(session_id).map_err(store_error),
            Err(_) => Err(being_loaded(session_id)),
        };
        self.release_load_gate(session_id, gate);
        let removed = removed?;
        tracing::info!(session = %session_id, children = removed.len() - 1, "deleted a session");
        Ok(())
    }

    /// The first step of `shutdown`: every session's running turn is cancelled (it ends
    /// `disposed`) and nothing starts a new turn from here on; what is queued stays pending in the
    /// logs.
    pub(crate) fn stop_turns(&self) {
        for (_, agent) in self.agents.all() {
            if agent.top_level().is_some() {
                agent.handle.stop();
            }
        }
    }

    /// Drains continuable children (child-first), then stops every agent (cancelling running
    /// turns) and flushes every session; then waits for the session query's catalog index.
    pub async fn shutdown(&self) {
        self.stop_turns();
        self.continuation.drain().await;
        let children = self.agents.drain(|agent| agent.child().is_some());
        futures::future::join_all(children.iter().map(|(_, child)| child.handle.shutdown())).await;
        let top: Vec<Agent> =
            self.agents.drain(|agent| agent.top_level().is_some()).into_iter().map(|(_, a)| a).collect();
        futures::future::join_all(top.iter().map(|agent| agent.handle.shutdown())).await;
        // The MCP servers go last: an agent winding down may still call them.
        futures::future::join_all(top.iter().filter_map(Agent::top_level).map(|top| top.mcp.close())).await;
        // The logs just closed, and what the last listings left behind, are in the catalog index
        // before kin exits (the watch's batch is not waited out).
        let query = self.query.clone();
        if tokio::task::spawn_blocking(move || query.source().settle()).await.is_err() {
            tracing::warn!("the catalog index could not be brought up to date at shutdown");
        }
    }
}

/// A `cwd` a request names (a listing's filter, a new session's directory): an absolute path.
pub(crate) fn absolute_cwd(cwd: &Path) -> Result<(), RuntimeError> {
    if !cwd.is_absolute() {
        return Err(RuntimeError::InvalidParams(format!("cwd must be an absolute path: {}", cwd.display())));
    }
    Ok(())
}

/// A new session's working directory: an absolute path to an existing directory (its commands,
/// MCP servers and file tools run there; a session in a directory that is not there would fail
/// every one of them).
fn check_cwd(cwd: &Path) -> Result<(), RuntimeError> {
    absolute_cwd(cwd)?;
    if !cwd.is_dir() {
        return Err(RuntimeError::InvalidParams(format!(
            "cwd {} is not an existing directory; give the absolute path of the workspace",
            cwd.display()
        )));
    }
    Ok(())
}

/// The refusal of a `session/delete` of a session being loaded or resumed.
fn being_loaded(session_id: &str) -> RuntimeError {
    RuntimeError::InvalidParams(format!(
        "session {session_id} is being loaded or resumed; close it (session/close) once that is done before deleting it"
    ))
}

/// A `session/close` whose first part was done as its request was read (`Runtime::begin_close`);
/// `finish` does the rest. Until it finishes (or is dropped) the session's load gate is held.
pub(crate) struct Closing {
    runtime: Arc<Runtime>,
    id: String,
    handle: crate::agent::AgentHandle,
    top: Arc<TopLevel>,
    gate: Option<Arc<tokio::sync::Mutex<()>>>,
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Closing {
    /// Stops the session's children and agent, flushes its log and frees it.
    pub(crate) async fn finish(self) -> Result<(), RuntimeError> {
        let (runtime, id, handle, top) = (self.runtime.clone(), self.id.clone(), self.handle.clone(), self.top.clone());
        let closed = runtime.finish_close(&id, handle, top).await;
        drop(self);
        closed
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        self.runtime.closing.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.id);
        drop(self.held.take());
        if let Some(gate) = self.gate.take() {
            self.runtime.release_load_gate(&self.id, gate);
        }
    }
}

/// The sandbox a restored session may take back from its log (`recorded`), with kin started in
/// the sandbox `start` and the permission mode `mode`: a sandbox lets commands it confines run
/// unasked, so over a start without one, where every command asks (`ask`, `accept-edits`), it
/// would be looser than the start and is not restored; elsewhere it is (the start's own clamp
/// applies after, in `SessionSandbox::restored`).
fn restorable_sandbox(
    recorded: Option<SandboxPolicy>,
    start: SandboxPolicy,
    mode: PermissionMode,
) -> Option<SandboxPolicy> {
    let asks_commands = match mode {
        PermissionMode::Ask | PermissionMode::AcceptEdits => true,
        PermissionMode::ReadOnly | PermissionMode::Bypass => false,
    };
    recorded.filter(|_| start.is_sandboxed() || !asks_commands)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_is_not_restored_over_a_start_where_every_command_asks() {
        let ro_net = SandboxPolicy::parse("read-only+network").unwrap();
        let ww = SandboxPolicy::parse("workspace-write").unwrap();
        for mode in [PermissionMode::Ask, PermissionMode::AcceptEdits] {
            assert_eq!(restorable_sandbox(Some(ro_net), SandboxPolicy::OFF, mode), None, "{mode}");
            assert_eq!(restorable_sandbox(Some(ro_net), ww, mode), Some(ro_net), "{mode}: clamped later");
        }
        // Where commands do not ask (bypass) or never run (read-only), a sandbox only confines.
        for mode in [PermissionMode::Bypass, PermissionMode::ReadOnly] {
            assert_eq!(restorable_sandbox(Some(ro_net), SandboxPolicy::OFF, mode), Some(ro_net), "{mode}");
        }
        assert_eq!(restorable_sandbox(None, ww, PermissionMode::Ask), None);
    }
}
