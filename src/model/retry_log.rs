//! Wraps an HTTP model so the retries it reports become `llm/retry` events: the client's retry
//! notice lands here, keyed by session, and the agent loop takes the entries when it next hears
//! from the stream (before the retried attempt's first chunk, or its failure).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::http::{RetryInfo, RetryNotice};
use super::router::{ModelSettings, model_for_route_with_notice};
use super::{ChunkStream, Model, ModelRequest, ModelRoute};
use crate::session::event::LlmRetry;

/// Pending retry events by session.
#[derive(Default)]
pub struct RetryLog {
    pending: Mutex<HashMap<String, Vec<LlmRetry>>>,
}

impl RetryLog {
    /// A notice callback feeding this log.
    pub fn notice(self: &Arc<Self>) -> RetryNotice {
        let log = self.clone();
        Arc::new(move |info: RetryInfo| {
            tracing::warn!(session = %info.session_id, attempt = info.attempt, delay_ms = info.delay_ms, code = %info.code, "retrying a model request: {}", info.reason);
            let event = LlmRetry {
                turn: info.turn,
                step: info.step,
                attempt: info.attempt,
                max_attempts: info.max_attempts,
                delay_ms: info.delay_ms,
                code: info.code,
                reason: info.reason,
                // Set when the server asked for a longer wait than the cap allows.
                requested_delay_ms: info.requested_delay_ms,
            };
            if let Ok(mut pending) = log.pending.lock() {
                pending.entry(info.session_id).or_default().push(event);
            }
        })
    }

    fn take(&self, session_id: &str) -> Vec<LlmRetry> {
        self.pending.lock().ok().and_then(|mut p| p.remove(session_id)).unwrap_or_default()
    }
}

/// The HTTP models of one process: a client per provider, built on first use for the route a
/// request names (so a session can switch models between turns), with retries recorded in a
/// `RetryLog`.
pub struct Routed {
    settings: ModelSettings,
    log: Arc<RetryLog>,
    clients: Mutex<HashMap<String, Arc<dyn Model>>>,
}

impl Routed {
    /// Checks that `default` can be served (an unknown provider is a startup error).
    pub fn new(default: &ModelRoute, settings: ModelSettings) -> Result<Self, String> {
        let routed = Routed { settings, log: Arc::new(RetryLog::default()), clients: Mutex::new(HashMap::new()) };
        routed.client(default)?;
        Ok(routed)
    }

    fn client(&self, route: &ModelRoute) -> Result<Arc<dyn Model>, String> {
        let mut clients = self.clients.lock().map_err(|_| "model clients poisoned".to_string())?;
        if let Some(client) = clients.get(&route.provider) {
            return Ok(client.clone());
        }
        let client =
            model_for_route_with_notice(route, &self.settings, &crate::config::process_env, Some(self.log.notice()))?;
        clients.insert(route.provider.clone(), client.clone());
        Ok(client)
    }
}

impl Model for Routed {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ChunkStream {
        match self.client(&request.route) {
            Ok(client) => client.stream(request, cancel),
            Err(message) => {
                let failure =
                    super::script::ReplayEntry::Throw { chunks: Vec::new(), message, code: "INVALID_CONFIG".into() };
                super::script::play(failure, request.cwd, cancel)
            }
        }
    }

    fn take_retries(&self, session_id: &str) -> Vec<LlmRetry> {
        self.log.take(session_id)
    }
}
