//! Wraps an HTTP model so the retries it reports become `llm/retry` events: the client's retry
//! notice lands here, keyed by session, and the agent loop takes the entries when it next hears
//! from the stream (before the retried attempt's first chunk, or its failure).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::http::{RetryInfo, RetryNotice};
use super::{ChunkStream, Model, ModelRequest};

/// Pending retry events by session.
#[derive(Default)]
pub struct RetryLog {
    pending: Mutex<HashMap<String, Vec<Value>>>,
}

impl RetryLog {
    /// A notice callback feeding this log.
    pub fn notice(self: &Arc<Self>) -> RetryNotice {
        let log = self.clone();
        Arc::new(move |info: RetryInfo| {
            tracing::warn!(session = %info.session_id, attempt = info.attempt, delay_ms = info.delay_ms, code = %info.code, "retrying a model request: {}", info.reason);
            let event = json!({
                "turn": info.turn,
                "step": info.step,
                "attempt": info.attempt,
                "maxAttempts": info.max_attempts,
                "delayMs": info.delay_ms,
                "code": info.code,
                "reason": info.reason,
            });
            if let Ok(mut pending) = log.pending.lock() {
                pending.entry(info.session_id).or_default().push(event);
            }
        })
    }

    fn take(&self, session_id: &str) -> Vec<Value> {
        self.pending.lock().ok().and_then(|mut p| p.remove(session_id)).unwrap_or_default()
    }
}

/// A model whose retries are recorded in a `RetryLog`.
pub struct Recorded {
    pub inner: Arc<dyn Model>,
    pub log: Arc<RetryLog>,
}

impl Model for Recorded {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ChunkStream {
        self.inner.stream(request, cancel)
    }

    fn take_retries(&self, session_id: &str) -> Vec<Value> {
        self.log.take(session_id)
    }
}
