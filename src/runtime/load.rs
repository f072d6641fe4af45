//! Loading and resuming stored sessions, one at a time per session, and the work they come
//! back with.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use super::agents::{Agent, Node};
use super::error::{RuntimeError, store_error, subagent_only};
use super::{Loaded, Runtime};
use crate::mcp::{McpSession, ServerSpec};
use crate::prompt::{self};
use crate::session::{Event, SessionObserver};

/// A session being opened (`Runtime::opening`); dropped once its request is answered.
pub(crate) struct Opening {
    runtime: Arc<Runtime>,
    id: String,
    gate: Option<Arc<tokio::sync::Mutex<()>>>,
}

/// The error for a request about a session a load or resume of which has not answered yet.
pub(super) fn still_opening(session_id: &str) -> RuntimeError {
    RuntimeError::InvalidParams(format!(
        "session {session_id} is still being loaded or resumed; send this once that request has answered"
    ))
}

impl Drop for Opening {
    fn drop(&mut self) {
        {
            let mut opening = self.runtime.opening.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(count) = opening.get_mut(&self.id) {
                *count -= 1;
                if *count == 0 {
                    opening.remove(&self.id);
                }
            }
        }
        if let Some(gate) = self.gate.take() {
            self.runtime.release_load_gate(&self.id, gate);
        }
    }
}

impl Runtime {
    /// Starts the work a loaded (or resumed) session came back with, after its response: its own
    /// pending inbox messages, in order, and each stored background child below it that has
    /// messages pending (cold-resumed, parents first). Nothing to do for a session that was live.
    /// It holds the session's load gate: another load or resume of it waits until the children
    /// are live (and is then refused while they work) instead of replacing the session under a
    /// restore half done.
    pub async fn run_restored(&self, session_id: &str) {
        let gate = self.load_gate(session_id);
        {
            let _restoring = gate.lock().await;
            self.restore_now(session_id).await;
        }
        self.release_load_gate(session_id, gate);
    }

    /// `run_restored` with the gate held.
    async fn restore_now(&self, session_id: &str) {
        let Some((handle, _)) = self.agents.top_level(session_id) else { return };
        // The turns of a top-level session have no waiter: their results are in its log.
        let _ = handle.wake().await;
        let route = self.session_model(session_id).unwrap_or_else(|| self.config.model.clone());
        self.continuation.restore_below(session_id, &route).await;
    }

    /// Loads a stored session (repairing a crash-interrupted turn), returns its events for
    /// replay to the client with its view, and makes it live. A live idle session is flushed and reloaded. A
    /// load or resume of the same session already under way is waited for first.
    pub(crate) async fn load_session(
        &self,
        session_id: &str,
        observer: Arc<dyn SessionObserver>,
        servers: Vec<ServerSpec>,
    ) -> Result<Loaded, RuntimeError> {
        let gate = self.load_gate(session_id);
        let loaded = {
            let _turn = gate.lock().await;
            self.load_now(session_id, observer, servers).await
        };
        self.release_load_gate(session_id, gate);
        Ok(Loaded { events: loaded?, view: self.view(session_id) })
    }

    /// Marks `session_id` as being opened (loaded or resumed) from the moment its request is
    /// read until the guard is dropped (after the answer): a request for the session meanwhile is
    /// told to wait for that answer instead of "unknown session" (`not_live`).
    pub(crate) fn opening(self: &Arc<Self>, session_id: &str) -> Opening {
        *self
            .opening
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(session_id.to_string())
            .or_default() += 1;
        Opening { gate: Some(self.load_gate(session_id)), runtime: self.clone(), id: session_id.to_string() }
    }

    /// Whether a load or resume of `session_id` was read and has not answered: a prompt for the
    /// session, live or not, waits for that answer (it would run on the agent the load replaces,
    /// and the load then be refused for the turn in flight).
    pub(super) fn is_opening(&self, session_id: &str) -> bool {
        self.opening.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(session_id)
    }

    /// The error for a request about `session_id` that is not live: unknown, or still being
    /// loaded or resumed.
    pub(super) fn not_live(&self, session_id: &str) -> RuntimeError {
        // Closed, as far as a request read after its `session/close` can tell.
        if self.is_closing(session_id) {
            return RuntimeError::NotFound(session_id.to_string());
        }
        if self.being_opened(session_id) {
            return still_opening(session_id);
        }
        RuntimeError::NotFound(session_id.to_string())
    }

    /// Whether a load or resume of `session_id` was read and has not answered (someone holds
    /// its gate: an `opening` mark or the load itself).
    pub(super) fn being_opened(&self, session_id: &str) -> bool {
        self.loading.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(session_id)
    }

    /// The gate of `session_id`'s loads and resumes.
    pub(super) fn load_gate(&self, session_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut loading = self.loading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        loading.entry(session_id.to_string()).or_default().clone()
    }

    /// Drops a gate; the last holder removes it (holders clone it under the same lock).
    pub(super) fn release_load_gate(&self, session_id: &str, gate: Arc<tokio::sync::Mutex<()>>) {
        let mut loading = self.loading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        drop(gate);
        if loading.get(session_id).is_some_and(|g| Arc::strong_count(g) == 1) {
            loading.remove(session_id);
        }
    }

    /// `load_session` with the session's gate held.
    pub(super) async fn load_now(
        &self,
        session_id: &str,
        observer: Arc<dyn SessionObserver>,
        servers: Vec<ServerSpec>,
    ) -> Result<Arc<Vec<Event>>, RuntimeError> {
        self.reject_child(session_id)?;
        // A live session's children run under its permissions, sandbox and MCP servers, which the
        // load replaces (capped at the start): they would go on under the old ones. While any is
        // live, the load is refused; nothing of theirs is stopped or lost.
        let below: Vec<String> = self.descendants(session_id).into_iter().map(|(id, _)| id).collect();
        if !below.is_empty() {
            return Err(RuntimeError::InvalidParams(format!(
                "session {session_id} has {} subagent(s) at work ({}); wait for them to finish, stop them with \
                 interrupt_agent, or close the session first (their queued messages stay on disk and run after the \
                 next load)",
                below.len(),
                below.join(", ")
            )));
        }
        let idle = |a: &Agent| a.is_top_level() && !a.handle.is_busy() && !a.handle.is_running();
        let existing = match self.agents.remove_if(session_id, idle) {
            Ok(existing) => existing,
            Err(kept) if kept.is_top_level() => {
                return Err(RuntimeError::InvalidParams(format!(
                    "session {session_id} has a turn in flight; cancel it before loading"
                )));
            }
            Err(_) => None,
        };
        if let Some(agent) = existing
            && let Some(top) = agent.top_level()
        {
            // The log is read back below: what the live session could not write would be gone
            // from it without a word.
            let disposed = agent.handle.dispose().await;
            top.mcp.close().await;
            if let Err(cause) = disposed {
                return Err(RuntimeError::Internal(format!(
                    "session {session_id} was live and not everything of it could be saved ({cause}); what was not \
                     written is lost: load it again to continue from what its log holds"
                )));
            }
        }
        let mut session = self.store.load(session_id).map_err(store_error)?;
        if session.header.parent_session.is_some() && session.header.origin.as_deref() == Some("subagent") {
            return Err(subagent_only(session_id));
        }
        // Its inbox is read back first: what settles without a turn is in the replayed history.
        let restored = crate::agent::prepare(&mut session)
            .map_err(|e| RuntimeError::Internal(format!("session {session_id} cannot be loaded: {e}")))?;
        let events = session.snapshot();
        self.took_back(&session.header, &events);
        // A resumed session keeps the prompt it was created with.
        let system = match prompt::recorded(&events) {
            Some(text) => text,
            None => {
                let cwd = session.header.cwd.as_deref().map(Path::new);
                self.build_prompt(cwd, &self.tools, self.config.persona.as_deref(), self.config.permission_mode)
                    .map_err(RuntimeError::Internal)?
            }
        };
        let mcp = self.mcp_for(&mut session, servers);
        session.add_observer(observer);
        self.start(session, system, mcp, restored);
        Ok(events)
    }

    /// What a session read back from its log gives the runtime besides the session: the record
    /// its tools keep of it (the files it has read), and the replay fixture's view of it.
    pub(super) fn took_back(&self, header: &crate::session::SessionHeader, events: &[Event]) {
        let cwd = header.cwd.as_deref().map(Path::new).unwrap_or(Path::new(""));
        self.tools.restore(&header.id, cwd, events);
        self.session_loaded(&header.id, events);
    }

    /// Reattaches a session without replay (`session/resume`): a live session stays as it is
    /// (its observer keeps forwarding), a stored one is loaded and made live with `observer`.
    /// Returns the events of a session it loaded (none for a live one). A load or resume of the
    /// same session already under way is waited for first (and then usually finds it live).
    pub(crate) async fn resume_session(
        &self,
        session_id: &str,
        observer: Arc<dyn SessionObserver>,
        servers: Vec<ServerSpec>,
    ) -> Result<Loaded, RuntimeError> {
        self.reject_child(session_id)?;
        if let Some((handle, top)) = self.agents.top_level(session_id) {
            let mcp = &top.mcp;
            // The servers named now replace other ones (the agent keeps running).
            let specs = crate::mcp::merge(&self.config.mcp_servers, servers);
            if specs != mcp.specs() {
                let _ = handle.inject_log(McpSession::describe(&specs));
                mcp.replace(specs).await;
            }
            return Ok(Loaded { events: Arc::default(), view: self.view(session_id) });
        }
        let gate = self.load_gate(session_id);
        let resumed = {
            let _turn = gate.lock().await;
            if self.agents.is_top_level(session_id) {
                Ok(Arc::default())
            } else {
                self.load_now(session_id, observer, servers).await
            }
        };
        self.release_load_gate(session_id, gate);
        Ok(Loaded { events: resumed?, view: self.view(session_id) })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::session::SessionHeader;

    use super::*;

    #[tokio::test]
    async fn a_session_being_loaded_is_not_deleted_under_the_load() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::for_tests(dir.path());
        let id = "5e2d3c1a-0000-4000-8000-000000000001";
        let mut stored = rt.store().create(SessionHeader::new(id, 0, Some(dir.path().display().to_string()))).unwrap();
        stored.flush().unwrap();
        drop(stored);

        let gate = rt.load_gate(id);
        let loading = gate.lock().await;
        let refused = rt.delete_session(id).unwrap_err().to_string();
        assert!(refused.contains("is being loaded or resumed"), "{refused}");
        assert!(rt.store().locate(id).unwrap().is_some(), "the log is still there");
        drop(loading);
        rt.release_load_gate(id, gate);
        rt.delete_session(id).unwrap();
        assert!(rt.store().locate(id).unwrap().is_none());
    }

    /// From the moment a load or resume of a session is read until it answers, a request about
    /// that session is told to wait for the answer, not that the session is unknown.
    #[tokio::test]
    async fn a_request_for_a_session_being_opened_is_told_to_wait_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::for_tests(dir.path());
        let id = "5e2d3c1a-0000-4000-8000-000000000003";
        let text = json!([{"type": "text", "text": "hi"}]).as_array().unwrap().clone();
        let mut stored = rt.store().create(SessionHeader::new(id, 0, Some(dir.path().display().to_string()))).unwrap();
        stored.flush().unwrap();
        drop(stored);
        let opening = rt.opening(id);
        let deleted = rt.delete_session(id).unwrap_err().to_string();
        assert!(deleted.contains(&format!("session {id} is being loaded or resumed")), "{deleted}");
        assert!(rt.store().locate(id).unwrap().is_some(), "a delete read after the load is refused");
        let refusals = [
            rt.prompt(id, text.clone()).err().unwrap().to_string(),
            rt.set_permission_mode(id, crate::permission::PermissionMode::Ask).err().unwrap().to_string(),
            rt.close_session(id).await.unwrap_err().to_string(),
        ];
        for refused in refusals {
            assert!(refused.contains(&format!("session {id} is still being loaded or resumed")), "{refused}");
        }
        drop(opening);
        assert!(rt.loading.lock().unwrap().is_empty(), "the mark is gone with its guard");
        let unknown = rt.prompt(id, text).err().unwrap().to_string();
        assert_eq!(unknown, format!("unknown session: {id}"));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn restoring_a_loaded_session_s_work_holds_its_load_gate() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::for_tests(dir.path());
        let id = "5e2d3c1a-0000-4000-8000-000000000002";
        let gate = rt.load_gate(id);
        let loading = gate.lock().await;
        let restoring = tokio::spawn({
            let rt = rt.clone();
            async move { rt.run_restored(id).await }
        });
        // One thread: the restore runs until it waits, and it waits for the load under way.
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        assert!(!restoring.is_finished(), "a restore waits for the load or resume holding the gate");
        drop(loading);
        restoring.await.unwrap();
        rt.release_load_gate(id, gate);
        assert!(rt.loading.lock().unwrap().is_empty(), "the gate is dropped by its last holder");
    }
}
