//! The model seam: `trait Model` has one method, which turns a request (messages, tools, system
//! prompt) into a stream of `ModelEvent`s (dsh `StreamChunk`s, and word of each retry in band,
//! where it happened), honouring a cancellation token. Implementations: the HTTP clients
//! (`http`, `openai`, `anthropic`, routed by `retry_log::Routed`), `replay` (recorded scenario
//! logs, keyless) and `scripted` (tests).

pub(crate) mod anthropic;
pub(crate) mod capacity;
pub(crate) mod chunk;
pub(crate) mod http;
pub(crate) mod keycheck;
pub(crate) mod openai;
pub(crate) mod replay;
pub(crate) mod routed;
pub(crate) mod router;
pub(crate) mod script;
mod sse;
mod utf16;

use std::path::PathBuf;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use crate::session::chunk::Failure;

pub use crate::session::chunk::FinishReason;

pub use crate::session::chunk::StreamChunk;
pub use chunk::text_response;
pub use chunk::tool_call_response;

/// A model route: `provider/model`, e.g. `deepseek/deepseek-v4-flash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRoute {
    pub provider: String,
    pub model: String,
}

impl ModelRoute {
    /// Parses `provider/model`; the model part may itself contain `/`.
    pub fn parse(route: &str) -> Result<Self, String> {
        match route.split_once('/') {
            Some((provider, model)) if !provider.is_empty() && !model.is_empty() => {
                Ok(ModelRoute { provider: provider.into(), model: model.into() })
            }
            _ => Err(format!(
                "model route {route:?} is not of the form provider/model (e.g. deepseek/deepseek-v4-flash)"
            )),
        }
    }
}

impl std::fmt::Display for ModelRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.provider, self.model)
    }
}

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSchema {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// One model call.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub session_id: String,
    /// The turn and step this call serves (replay uses them to resume after a restart).
    pub turn: u64,
    pub step: u64,
    pub cwd: Option<PathBuf>,
    pub route: ModelRoute,
    pub system: String,
    /// dsh messages (`{id, role, content, source}`), the surface fold of the session.
    /// Shared with the session's fold: a request costs no copy of the history.
    pub messages: std::sync::Arc<Vec<Value>>,
    pub tools: Vec<ToolSchema>,
    /// What the call is for.
    pub purpose: Purpose,
    /// This call's output cap, in place of the configured `max_tokens` (a compaction's summary).
    pub max_tokens: Option<u32>,
}

/// What a model call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Purpose {
    /// A step of a turn: its answer is the `assistant/chunk`s and `assistant/message` of the step.
    #[default]
    Step,
    /// A compaction's summary: its answer is recorded as `compact/summary`.
    Compaction,
    /// A session's title (`title_model`, `crate::title`): its answer is recorded as
    /// `session/title`.
    Title,
}

/// One item of a model call's stream: a chunk of the answer, or word that an attempt failed and
/// the call is about to be retried (sent before the wait, so it comes in order: after the failed
/// attempt, before the retried attempt's first chunk or the call's failure).
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    Chunk(StreamChunk),
    Retry(RetryInfo),
}

/// One retry of a model call, reported before the client waits `delay_ms`. The consumer knows
/// which call it made: the agent loop writes it as `llm/retry` with the call's turn and step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryInfo {
    /// The attempt about to start (2 for the first retry).
    pub attempt: u32,
    pub max_attempts: u32,
    pub delay_ms: u64,
    /// The failure code of the failed attempt (`RATE_LIMITED`, `TIMEOUT`, ...).
    pub code: String,
    /// The failure message of the failed attempt (never contains the API key).
    pub reason: String,
    /// The server's `Retry-After` when it asked for longer than `max_retry_after_ms`: the wait
    /// (`delay_ms`) was capped.
    pub requested_delay_ms: Option<u64>,
}

impl RetryInfo {
    /// The `llm/retry` event of this retry of the call serving `turn` (`None` between turns) and
    /// `step`.
    pub(crate) fn event(self, turn: Option<u64>, step: u64) -> crate::session::event::LlmRetry {
        let RetryInfo { attempt, max_attempts, delay_ms, code, reason, requested_delay_ms } = self;
        crate::session::event::LlmRetry {
            turn,
            step,
            attempt,
            max_attempts,
            delay_ms,
            code,
            reason,
            requested_delay_ms,
        }
    }
}

/// One item of a model call, or the failure that ends it (before or during streaming).
pub type ModelResult = Result<ModelEvent, Failure>;
/// What a model call yields.
pub type ChunkStream = mpsc::Receiver<ModelResult>;

/// A language model behind some transport: one streaming method. Replay and test hooks are not
/// here (a replayed run reaches the runtime through its fixture, `scenario::fixture`), nor is the
/// key check of the HTTP models (`routed::Routed::missing_key`, which the runtime holds beside).
pub trait Model: Send + Sync {
    /// Starts one call. The stream ends after `finish`, after an error, or when cancelled.
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ChunkStream;
}

/// A provider's key that is neither in the environment nor stored by `kin login`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingKey {
    pub provider: String,
    /// The variable the key is read from (`DEEPSEEK_API_KEY`).
    pub variable: String,
}
