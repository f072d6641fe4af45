//! The subagent seam (seed 003, dsh-design.md §1.6–1.8): a service owning named providers that
//! start child agents. `start` validates a one-shot request against the provider's static
//! capabilities and the depth cap **before** any child exists, snapshots the descriptor, and
//! observes the run with an observe-only `subagent/start` / `subagent/end` pair.

pub(crate) mod agents;
pub(crate) mod catalog;
pub(crate) mod continuation;
pub(crate) mod control;
pub(crate) mod error;
pub(crate) mod external;
pub(crate) mod inprocess;
pub(crate) mod list_agents;
pub(crate) mod tools;

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::model::ModelRoute;
/// The `subagent/descriptor` format (disk format, so it lives in `session/`).
pub use crate::session::descriptor;
use crate::tools::Caller;
pub(crate) use descriptor::AgentRecord;
pub(crate) use descriptor::Descriptor;
pub(crate) use descriptor::ToolFilter;
pub use error::ErrorCode;
pub use error::SubagentError;

/// Start-time features a provider supports for one-shot runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub output_schema: bool,
    pub depth_limit: bool,
    pub tool_filter: bool,
    pub persona: bool,
    /// A named agent's permission cap and turn limit (`StartRequest::agent`).
    pub named_agent: bool,
}

impl Capabilities {
    pub const ALL: Capabilities =
        Capabilities { output_schema: true, depth_limit: true, tool_filter: true, persona: true, named_agent: true };
    pub const NONE: Capabilities = Capabilities {
        output_schema: false,
        depth_limit: false,
        tool_filter: false,
        persona: false,
        named_agent: false,
    };
}

/// The named agent a child is started as: its name, and what it fixes besides the persona, tool
/// filter and model (which the request carries as for any child).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedAgent {
    pub name: String,
    /// The child's permission mode never goes above this (nor above its parent's).
    pub permission_cap: Option<crate::permission::PermissionMode>,
    /// Model calls per turn (at most `agent.max_steps`).
    pub max_turns: Option<u32>,
}

impl NamedAgent {
    /// What the descriptor records of it.
    pub fn record(&self) -> AgentRecord {
        AgentRecord {
            name: self.name.clone(),
            permission_mode: self.permission_cap.map(|m| m.id().to_string()),
            max_turns: self.max_turns.map(u64::from),
        }
    }

    /// The agent a descriptor recorded. A permission mode this kin does not know is read as
    /// `read-only` (fail closed).
    pub fn from_record(record: &AgentRecord) -> NamedAgent {
        let permission_cap = record.permission_mode.as_deref().map(|id| {
            crate::permission::PermissionMode::parse(id).unwrap_or_else(|| {
                tracing::warn!(agent = %record.name, "recorded permission mode {id:?} is unknown; the child runs read-only");
                crate::permission::PermissionMode::ReadOnly
            })
        });
        NamedAgent {
            name: record.name.clone(),
            permission_cap,
            max_turns: record.max_turns.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        }
    }
}

/// What a child's text keeps when it reaches its parent (its final answer, a report, its
/// closing message, an external agent's answer): its first and last 40 000 bytes, with a note
/// of what was left out between them.
pub(crate) const OUTPUT_LIMITS: crate::tools::capture::Limits =
    crate::tools::capture::Limits { head: 40_000, tail: 40_000 };

/// The longest child title shown (in characters): the rest is cut, with `…`.
const MAX_TITLE_CHARS: usize = 200;

/// How a child is titled for the editor and in `list_agents`: `<agent>: <label>` when it was
/// started as a named agent; on one line (control, bidi and zero-width characters escaped, so
/// a label cannot forge another entry) and at most `MAX_TITLE_CHARS` characters.
pub(crate) fn child_title(agent: Option<&str>, label: Option<&str>) -> Option<String> {
    let title = match (agent, label.filter(|l| !l.trim().is_empty())) {
        (Some(agent), Some(label)) => format!("{agent}: {label}"),
        (Some(agent), None) => agent.to_string(),
        (None, label) => label?.to_string(),
    };
    // The first `MAX_TITLE_CHARS` characters of a longer title, then `…`.
    Some(crate::session::cut_chars(&crate::tools::shown_on_one_line(&title), MAX_TITLE_CHARS + 1))
}

/// A one-shot delegation as the caller asks for it.
#[derive(Clone)]
pub struct StartRequest {
    pub label: Option<String>,
    pub prompt: Vec<Value>,
    pub parent: Arc<Caller>,
    pub cancel: CancellationToken,
    /// The child's model route; the parent's when `None`.
    pub route: Option<ModelRoute>,
    /// An object-rooted JSON Schema the child must satisfy through `structured_output`.
    pub output_schema: Option<Value>,
    pub max_depth: Option<u64>,
    pub tool_filter: Option<ToolFilter>,
    pub persona: Option<String>,
    /// The parent's tool call that asks for the child (editors link it to the child session).
    pub call_id: Option<String>,
    /// Where a provider reports the child's activity on that call while it runs.
    pub progress: Option<crate::tools::Progress>,
    /// The named agent the child is started as (its persona, filter and model are above).
    pub agent: Option<NamedAgent>,
}

/// A request after the service validated it.
#[derive(Clone)]
pub struct ResolvedStart {
    pub request: StartRequest,
    pub descriptor: Descriptor,
    /// The child's delegation depth (parent's effective depth + 1).
    pub child_depth: u64,
}

/// How a child run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Completed,
    Aborted,
    Error,
    MaxTokens,
    Refusal,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Completed => "completed",
            StopReason::Aborted => "aborted",
            StopReason::Error => "error",
            StopReason::MaxTokens => "max-tokens",
            StopReason::Refusal => "refusal",
        }
    }
}

/// The outcome of a one-shot run: the child's final text, the captured structured output when
/// a schema was requested, and the stop reason.
#[derive(Debug, Clone, PartialEq)]
pub struct SubagentResult {
    pub output: String,
    pub structured: Option<Value>,
    pub stop_reason: StopReason,
    /// Why a run that did not complete ended, in the child's words (its turn's error, or the
    /// external agent's failure), when there is one: the model reads it after
    /// `subagent run failed: `.
    pub failure: Option<String>,
    /// Set by providers whose child is not a local session (`acp:*`): what the parent's log
    /// records about the run.
    pub remote: Option<RemoteRun>,
}

/// A run of a child that has no local session (an external ACP agent).
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteRun {
    pub provider: String,
    /// The program name only: no directory, arguments or environment (they may hold secrets).
    pub command: String,
    /// The session id the child reported for itself.
    pub child_session_id: String,
    /// Why the run failed, when it did (e.g. the child's JSON-RPC error message).
    pub error: Option<String>,
}

impl RemoteRun {
    /// The `subagent/remote-run` event a delegation tool records in the parent's log.
    pub fn event(&self, run_id: &str, output: &str, stop_reason: StopReason) -> crate::session::event::RemoteRun {
        crate::session::event::RemoteRun {
            run_id: run_id.to_string(),
            provider: self.provider.clone(),
            command: self.command.clone(),
            child_session_id: self.child_session_id.clone(),
            output: output.to_string(),
            stop_reason: stop_reason.as_str().to_string(),
            error: self.error.clone(),
        }
    }
}

/// Resolves with the result; an `Err` is an infrastructure fault (child failures are stop reasons).
pub(crate) type ResultReceiver = oneshot::Receiver<Result<SubagentResult, SubagentError>>;

/// Disposal of a run: resolves when the child is gone, with the cause when it could not be
/// disposed cleanly (e.g. its log's final flush failed).
pub type Dispose = Box<dyn FnOnce() -> BoxFuture<'static, Result<(), String>> + Send>;

/// A published one-shot child: its id (the child session id for local runs), the result, and
/// disposal, which the consumer always awaits.
pub struct SubagentRun {
    pub id: String,
    pub local: bool,
    pub cwd: Option<String>,
    pub result: ResultReceiver,
    pub dispose: Dispose,
}

/// A named child-agent transport.
pub trait SubagentProvider: Send + Sync {
    fn name(&self) -> &str;
    fn capabilities(&self) -> Capabilities;
    /// True when children are seeded with the parent's completed turns (fork).
    fn inherits_parent_context(&self) -> bool;
    /// The creation seed of a continuable child (spawn: none; fork: the parent's completed
    /// turns), or `None` when the provider cannot host continuable children.
    fn prepare_continuable(&self, _parent: &Caller) -> Option<Vec<crate::session::Event>> {
        None
    }
    /// Publishes the child and returns its run; a rejection leaves nothing behind.
    fn start(&self, request: ResolvedStart) -> BoxFuture<'static, Result<SubagentRun, SubagentError>>;
    /// How long a cancelled run may take to end with its result (the delegating call waits that
    /// long for it before giving up); `None`: the tools' default.
    fn wind_down(&self) -> Option<std::time::Duration> {
        None
    }
}

/// Observe-only lifecycle of runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Lifecycle {
    Start {
        run_id: String,
        provider: String,
        id: String,
        local: bool,
    },
    End {
        run_id: String,
        provider: String,
        id: String,
        local: bool,
        cwd: Option<String>,
        /// `None` when the run had no result (an infrastructure failure, in `failure`).
        stop_reason: Option<StopReason>,
        /// The child's final output (its last assistant text), when the run had a result.
        output: Option<String>,
        /// Why the run failed: the infrastructure fault, or the child's own failure.
        failure: Option<String>,
    },
}

type Observer = Arc<dyn Fn(&Lifecycle) + Send + Sync>;

/// `ctx.subagents`: the provider registry and one-shot starts.
#[derive(Default)]
pub struct SubagentService {
    providers: Mutex<Vec<Arc<dyn SubagentProvider>>>,
    observers: Mutex<Vec<Observer>>,
}

impl SubagentService {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a provider under its unique name.
    pub fn register_provider(&self, provider: Arc<dyn SubagentProvider>) -> Result<(), SubagentError> {
        let mut providers = self.providers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if providers.iter().any(|p| p.name() == provider.name()) {
            return Err(SubagentError::new(
                ErrorCode::DuplicateProvider,
                format!("a subagent provider named \"{}\" is already registered", provider.name()),
            ));
        }
        providers.push(provider);
        Ok(())
    }

    /// The provider named `name`.
    pub fn provider(&self, name: &str) -> Result<Arc<dyn SubagentProvider>, SubagentError> {
        let providers = self.providers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        providers.iter().find(|p| p.name() == name).cloned().ok_or_else(|| {
            SubagentError::new(ErrorCode::NoProvider, format!("no subagent provider registered for \"{name}\""))
        })
    }

    /// Provider names in registration order.
    pub fn list(&self) -> Vec<String> {
        let providers = self.providers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        providers.iter().map(|p| p.name().to_string()).collect()
    }

    /// Adds an observer of run lifecycles (its panics are contained).
    pub fn observe(&self, observer: impl Fn(&Lifecycle) + Send + Sync + 'static) {
        self.observers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Arc::new(observer));
    }

    pub(crate) fn emit(&self, event: &Lifecycle) {
        let observers: Vec<Observer> = self.observers.lock().map(|o| o.clone()).unwrap_or_default();
        for observer in observers {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| observer(event))).is_err() {
                tracing::error!("a subagent lifecycle observer panicked");
            }
        }
    }

    /// Starts a one-shot run: provider lookup, capability checks, depth, schema shape, the
    /// descriptor snapshot, then `provider.start`; all checks happen before any child exists.
    pub async fn start(
        self: &Arc<Self>,
        provider_name: &str,
        request: StartRequest,
    ) -> Result<SubagentRun, SubagentError> {
        let provider = self.provider(provider_name)?;
        check_capabilities(provider.as_ref(), &request)?;
        let child_depth = child_depth(request.parent.depth, request.max_depth)?;
        if let Some(schema) = &request.output_schema
            && schema.get("type").and_then(Value::as_str) != Some("object")
        {
            return Err(SubagentError::new(
                ErrorCode::InvalidRequest,
                "outputSchema must be an object-rooted JSON Schema (\"type\": \"object\")",
            ));
        }
        let descriptor = Descriptor::OneShot {
            provider: provider_name.to_string(),
            label: request.label.clone(),
            agent: request.agent.as_ref().map(NamedAgent::record),
        };
        let run = provider.start(ResolvedStart { request, descriptor, child_depth }).await?;
        Ok(self.observe_run(provider_name, run))
    }

    /// Emits `subagent/start` now and `subagent/end` when the result settles.
    fn observe_run(self: &Arc<Self>, provider: &str, run: SubagentRun) -> SubagentRun {
        let run_id = uuid::Uuid::new_v4().to_string();
        self.emit(&Lifecycle::Start {
            run_id: run_id.clone(),
            provider: provider.into(),
            id: run.id.clone(),
            local: run.local,
        });
        let (tx, rx) = oneshot::channel();
        let service = self.clone();
        let (provider, id, local, cwd) = (provider.to_string(), run.id.clone(), run.local, run.cwd.clone());
        let inner = run.result;
        tokio::spawn(async move {
            let result = inner.await.unwrap_or_else(|_| {
                Err(SubagentError::new(ErrorCode::Infrastructure, "subagent run ended without a result"))
            });
            let (stop_reason, output, failure) = match &result {
                Ok(r) => (Some(r.stop_reason), Some(r.output.clone()), r.failure.clone()),
                Err(fault) => (None, None, Some(fault.message.clone())),
            };
            service.emit(&Lifecycle::End { run_id, provider, id, local, cwd, stop_reason, output, failure });
            let _ = tx.send(result);
        });
        SubagentRun { result: rx, ..run }
    }
}

fn check_capabilities(provider: &dyn SubagentProvider, request: &StartRequest) -> Result<(), SubagentError> {
    let caps = provider.capabilities();
    let needed = [
        ("outputSchema", request.output_schema.is_some(), caps.output_schema),
        ("depthLimit", request.max_depth.is_some(), caps.depth_limit),
        ("toolFilter", request.tool_filter.is_some(), caps.tool_filter),
        ("persona", request.persona.is_some(), caps.persona),
        ("namedAgent", request.agent.is_some(), caps.named_agent),
    ];
    match needed.iter().find(|(_, wanted, supported)| *wanted && !*supported) {
        Some((cap, _, _)) => Err(SubagentError::new(
            ErrorCode::UnsupportedCapability,
            format!("subagent provider \"{}\" does not support the \"{cap}\" capability", provider.name()),
        )),
        None => Ok(()),
    }
}

/// Largest integer a JSON number holds exactly (dsh's "safe integer").
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The child's depth, or the depth error when it would exceed `max_depth`.
pub fn child_depth(parent_depth: u64, max_depth: Option<u64>) -> Result<u64, SubagentError> {
    if max_depth.is_some_and(|m| m > MAX_SAFE_INTEGER) {
        return Err(SubagentError::new(
            ErrorCode::InvalidRequest,
            "subagent maxDepth must be a non-negative safe integer",
        ));
    }
    let depth = parent_depth.checked_add(1).filter(|d| *d <= MAX_SAFE_INTEGER).ok_or_else(|| {
        SubagentError::new(ErrorCode::InvalidRequest, format!("subagent depth overflows after {parent_depth}"))
    })?;
    match max_depth {
        Some(max) if depth > max => {
            Err(SubagentError::new(ErrorCode::Depth, format!("subagent depth {depth} exceeds maxDepth {max}")))
        }
        _ => Ok(depth),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_title_is_one_bounded_line() {
        assert_eq!(child_title(Some("reviewer"), Some("check it")).as_deref(), Some("reviewer: check it"));
        assert_eq!(child_title(None, Some("  ")), None);
        // A line break cannot forge a second `list_agents` entry; escapes and bidi are shown.
        let forged = "tests\n00000000-0000-4000-8000-000000000000 [running] — deploy\u{1b}[2J\u{202e}txt";
        let title = child_title(None, Some(forged)).unwrap();
        assert!(!title.contains('\n') && !title.contains('\u{1b}') && !title.contains('\u{202e}'), "{title}");
        assert!(title.contains("tests\\u{a}00000000"), "{title}");
        let long = child_title(None, Some(&"é".repeat(5_000))).unwrap();
        assert_eq!(long.chars().count(), MAX_TITLE_CHARS + 1, "cut, with an ellipsis");
        assert!(long.ends_with('…'));
    }
}
