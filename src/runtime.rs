//! The runtime: the live agents of one `kin` process and the operations the protocol layer
//! calls (new, prompt, cancel, load, list, shutdown). It knows nothing about ACP.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::agent::{AgentDeps, AgentHandle, TurnEnd, spawn_agent};
use crate::config::Config;
use crate::model::replay::ReplayModel;
use crate::model::script::{ReplayEntry, play};
use crate::model::{ChunkStream, Model, ModelRequest};
use crate::session::{
    Event, SessionHeader, SessionObserver, SessionStore, StoreError, StoredSession, now_ms,
};
use crate::tools::ToolRegistry;

/// A request the caller got wrong (maps to invalid params) or a failure of kin itself.
#[derive(Debug, Clone, PartialEq)]
pub enum RuntimeError {
    InvalidParams(String),
    Internal(String),
}

impl std::fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuntimeError::InvalidParams(m) | RuntimeError::Internal(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for RuntimeError {}

struct Live {
    handle: AgentHandle,
    prompt_in_flight: Arc<AtomicBool>,
}

/// The sessions of one process.
pub struct Runtime {
    config: Config,
    store: SessionStore,
    model: Arc<dyn Model>,
    tools: ToolRegistry,
    live: Mutex<HashMap<String, Live>>,
}

/// A model for routes kin cannot reach yet: every call fails with a clear message.
struct UnavailableModel(String);

impl Model for UnavailableModel {
    fn stream(
        &self,
        request: ModelRequest,
        cancel: tokio_util::sync::CancellationToken,
    ) -> ChunkStream {
        let entry = ReplayEntry::Throw {
            chunks: Vec::new(),
            message: self.0.clone(),
            code: "MODEL_UNAVAILABLE".into(),
        };
        play(entry, request.cwd, cancel)
    }
}

/// Picks the model for a configuration: replay when a scenario directory is given.
pub fn model_for(config: &Config) -> Result<Arc<dyn Model>> {
    if let Some(dir) = &config.replay {
        return Ok(Arc::new(ReplayModel::from_dir(dir)?));
    }
    Ok(Arc::new(UnavailableModel(format!(
        "model route {} has no client in this build; run keyless with --replay DIR (a recorded scenario)",
        config.model
    ))))
}

impl Runtime {
    pub fn new(config: Config, model: Arc<dyn Model>, tools: ToolRegistry) -> Self {
        let store = SessionStore::new(config.sessions_dir.clone());
        Runtime {
            config,
            store,
            model,
            tools,
            live: Mutex::new(HashMap::new()),
        }
    }

    pub fn store(&self) -> &SessionStore {
        &self.store
    }

    fn deps(&self) -> AgentDeps {
        AgentDeps {
            model: self.model.clone(),
            tools: self.tools.clone(),
            route: self.config.model.clone(),
            system: String::new(),
            max_steps: self.config.max_steps,
            max_parallel_tools: self.config.max_parallel_tools,
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates a top-level session in `cwd` (absolute) and starts its agent.
    pub fn new_session(
        &self,
        cwd: &Path,
        observer: Arc<dyn SessionObserver>,
    ) -> Result<String, RuntimeError> {
        if !cwd.is_absolute() {
            return Err(RuntimeError::InvalidParams(format!(
                "cwd must be an absolute path: {}",
                cwd.display()
            )));
        }
        let id = self.mint_session_id();
        let header = SessionHeader::new(id.clone(), now_ms(), Some(cwd.display().to_string()));
        let mut session = self
            .store
            .create(header)
            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        // The session exists on disk before the client learns its id.
        session
            .flush()
            .map_err(|e| RuntimeError::Internal(format!("cannot create the session log: {e:#}")))?;
        session.add_observer(observer);
        let handle = spawn_agent(session, self.deps());
        self.live().insert(
            id.clone(),
            Live {
                handle,
                prompt_in_flight: Arc::new(AtomicBool::new(false)),
            },
        );
        Ok(id)
    }

    /// A new session id: the model's pinned id (replay) unless already used, else a UUID.
    fn mint_session_id(&self) -> String {
        while let Some(id) = self.model.next_session_id() {
            if matches!(self.store.locate(&id), Ok(None)) && !self.live().contains_key(&id) {
                return id;
            }
        }
        uuid::Uuid::new_v4().to_string()
    }

    /// Starts a user turn; the receiver resolves with how it ended. One prompt per session.
    pub fn prompt(
        &self,
        session_id: &str,
        content: Vec<Value>,
    ) -> Result<oneshot::Receiver<TurnEnd>, RuntimeError> {
        let live = self.live();
        let Some(entry) = live.get(session_id) else {
            return Err(RuntimeError::InvalidParams(format!(
                "unknown session: {session_id}"
            )));
        };
        if entry.prompt_in_flight.swap(true, Ordering::SeqCst) {
            return Err(RuntimeError::InvalidParams(
                "a prompt is already in flight for this session".into(),
            ));
        }
        let turn = entry
            .handle
            .followup(content, json!({"kind": "user"}))
            .map_err(|e| {
                entry.prompt_in_flight.store(false, Ordering::SeqCst);
                RuntimeError::Internal(e.to_string())
            })?;
        let flag = entry.prompt_in_flight.clone();
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let end = turn.await.unwrap_or(TurnEnd::Disposed);
            flag.store(false, Ordering::SeqCst);
            let _ = tx.send(end);
        });
        Ok(rx)
    }

    /// Cancels the running turn of a session; unknown ids are ignored.
    pub fn cancel(&self, session_id: &str) {
        if let Some(entry) = self.live().get(session_id) {
            entry.handle.cancel();
        }
    }

    /// Loads a stored session (repairing a crash-interrupted turn), returns its events for
    /// replay to the client, and makes it live. A live idle session is flushed and reloaded.
    pub async fn load_session(
        &self,
        session_id: &str,
        observer: Arc<dyn SessionObserver>,
    ) -> Result<Vec<Event>, RuntimeError> {
        let existing = {
            let mut live = self.live();
            match live.get(session_id) {
                Some(entry) if entry.prompt_in_flight.load(Ordering::SeqCst) => {
                    return Err(RuntimeError::InvalidParams(format!(
                        "session {session_id} has a prompt in flight; cancel it before loading"
                    )));
                }
                Some(_) => live.remove(session_id),
                None => None,
            }
        };
        if let Some(entry) = existing {
            entry.handle.shutdown().await;
        }
        let mut session = self.store.load(session_id).map_err(|e| match e {
            StoreError::InvalidId(_) | StoreError::NotFound(_) => {
                RuntimeError::InvalidParams(e.to_string())
            }
            StoreError::Scan(_) | StoreError::Io(_) => RuntimeError::Internal(e.to_string()),
        })?;
        if session.header.parent_session.is_some()
            && session.header.origin.as_deref() == Some("subagent")
        {
            return Err(RuntimeError::InvalidParams(format!(
                "session {session_id} is a subagent child; load its parent instead"
            )));
        }
        let events = session.events().to_vec();
        session.add_observer(observer);
        let handle = spawn_agent(session, self.deps());
        self.live().insert(
            session_id.to_string(),
            Live {
                handle,
                prompt_in_flight: Arc::new(AtomicBool::new(false)),
            },
        );
        Ok(events)
    }

    /// Top-level sessions (never children), newest first, optionally only those in `cwd`.
    pub fn list_sessions(&self, cwd: Option<&Path>) -> Vec<StoredSession> {
        self.store.list_top_level(cwd)
    }

    /// Stops every agent (cancelling running turns) and flushes every session.
    pub async fn shutdown(&self) {
        let handles: Vec<AgentHandle> = self.live().drain().map(|(_, l)| l.handle).collect();
        futures::future::join_all(handles.iter().map(AgentHandle::shutdown)).await;
    }

    /// Checks that the model served everything it expected (replay).
    pub fn check_model_consumed(&self) -> Result<(), String> {
        self.model.check_consumed()
    }
}
