//! The `acp` provider (dsh-design.md §1.7, issue 8): an external ACP agent process (another kin,
//! a third-party agent, or `ssh host kin acp`) as a one-shot child. A run spawns the configured
//! command (`process`), speaks ACP to it as a client through the protocol module (`port`: the
//! handshake, the prompt, cancellation), collects the agent's answer text as the output (bounded:
//! its head and tail, with a note of what was cut), reports each tool call it starts as progress
//! on the delegating call, and maps its stop reason (an error it answers and a stop reason kin
//! does not know are quoted up to `MAX_ERROR_TEXT_BYTES`, with a note of the rest). The agent's
//! own requests are answered under the configured permission policy (`answers`): permission
//! requests, and `fs/read_text_file` / `fs/write_text_file` served from the run's working
//! directory, never outside it, and only for regular files; anything else is method-not-found.
//!
//! The child has no local session: the run id is minted here (`acp-<uuid>`), the run is not
//! listed, and the delegation tool records it in the parent's log (`subagent/remote-run`).
//! Cancellation sends `session/cancel` and closes stdin, waits `cancel_grace`, then kills the
//! child's process group and waits `kill_grace`; every path reaps the child.
//!
//! `forward` asks the parent's editor: the child's permission requests become requests on the
//! parent's session and the delegating tool call (the runtime's editor lets the session's
//! permission mode answer first), and the answer is passed back as the child's matching option.
//! Reads inside the working directory are served; a write inside it is served right after the
//! editor allowed one of the child's edits (or allowed them always), else the editor is asked
//! about that write; the session's permission mode answers first each time, so a session switched
//! to read-only refuses the write whatever was allowed before. A provider built without an editor
//! answers `forward` like `allow-reads`; the runtime's asks the connected client, and with none
//! connected every question is a rejection.

mod answers;
pub(crate) mod port;
mod process;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::tools::external_title;
use super::{
    Capabilities, ErrorCode, RemoteRun, ResolvedStart, StartRequest, StopReason, SubagentError, SubagentProvider,
    SubagentResult, SubagentRun,
};
use crate::permission::{CallShown, PermissionPrompt};
use crate::session::SessionHeader;
use crate::tools::Access;
use crate::tools::capture::{MAX_ERROR_TEXT_BYTES, cut};
use answers::{Answers, Forward};
use port::{Failure, FileOffer, RemoteAgent, RemoteSession, RemoteStop, StartFailure};
use process::{AgentProcess, describe_status};

/// The agent's answer text beyond this many bytes keeps only its head and tail (with a note).
pub const MAX_OUTPUT_BYTES: usize = answers::OUTPUT_LIMITS.total();

/// How long `initialize` plus `session/new` may take by default.
pub(crate) const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a child may take to exit after its stdin closes (dsh's `disposeEofGraceMs`).
pub(crate) const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(6);
/// How long to wait for the child after killing it (dsh's `disposeGraceMs`).
pub(crate) const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(3);
/// How long a broken connection waits for the child's exit status, to name it in the error.
const EXIT_PROBE: Duration = Duration::from_millis(500);

/// How the child's own requests are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcpPermission {
    /// Every permission request is rejected and every file request refused.
    Reject,
    /// Reads inside the working directory are served, and read/search permission requests allowed
    /// when every path they name lies inside it; writes and every other permission request are
    /// rejected.
    AllowReads,
    /// Permission requests are asked of the parent's editor; reads inside the working directory
    /// are served, writes inside it when the editor allowed them.
    Forward,
}

impl AcpPermission {
    /// Parses a config value: `reject`, `allow-reads` or `forward`.
    pub fn parse(id: &str) -> Option<Self> {
        match id {
            "reject" => Some(AcpPermission::Reject),
            "allow-reads" => Some(AcpPermission::AllowReads),
            "forward" => Some(AcpPermission::Forward),
            _ => None,
        }
    }

    pub fn id(self) -> &'static str {
        match self {
            AcpPermission::Reject => "reject",
            AcpPermission::AllowReads => "allow-reads",
            AcpPermission::Forward => "forward",
        }
    }

    pub(crate) fn allows_reads(self) -> bool {
        matches!(self, AcpPermission::AllowReads | AcpPermission::Forward)
    }
}

/// One configured external agent (`[acp_agents.NAME]`).
#[derive(Clone)]
pub struct ExternalAgentConfig {
    /// The provider name, `acp:NAME`.
    pub name: String,
    /// The delegation tool's name (default `delegate_NAME`).
    pub tool_name: String,
    /// A sentence for the tool description saying what the agent is (default: its name).
    pub description: Option<String>,
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The child's working directory (`session/new`'s cwd); default: the parent session's.
    pub cwd: Option<PathBuf>,
    pub permission: AcpPermission,
    /// Bound on `initialize` plus `session/new`.
    pub startup_timeout: Duration,
    /// Bound on the prompt turn; `None`: no bound.
    pub turn_timeout: Option<Duration>,
    /// How long the child may take to exit after `session/cancel` and the end of its stdin.
    pub cancel_grace: Duration,
    /// How long to wait for the child after killing it.
    pub kill_grace: Duration,
    /// `sandbox = ...`: the kernel sandbox the child process runs in (`None`: none).
    pub sandbox: Option<crate::sandbox::SandboxSettings>,
}

impl ExternalAgentConfig {
    /// The agent `key` (provider `acp:KEY`, tool `delegate_KEY`), policy `reject`, default timeouts.
    pub fn new(key: &str, command: impl Into<String>) -> Self {
        ExternalAgentConfig {
            name: format!("acp:{key}"),
            tool_name: default_tool_name(key),
            description: None,
            command: command.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            permission: AcpPermission::Reject,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            turn_timeout: None,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            kill_grace: DEFAULT_KILL_GRACE,
            sandbox: None,
        }
    }

    /// The program's file name, without directory, arguments or environment.
    pub fn program_name(&self) -> String {
        Path::new(&self.command)
            .file_name()
            .map_or_else(|| self.command.clone(), |name| name.to_string_lossy().into_owned())
    }

    /// The sentence the delegation tool adds to its description.
    pub fn tool_note(&self) -> String {
        match &self.description {
            Some(text) => text.clone(),
            None => {
                let key = self.name.strip_prefix("acp:").unwrap_or(&self.name);
                format!("The child is the external agent `{key}`, a separate process with its own tools and model.")
            }
        }
    }
}

impl ExternalAgentConfig {
    /// How long a cancelled run may take to end with its result: the agent's grace to answer
    /// `session/cancel`, and a second for its kill (immediate unless the process is stuck) and
    /// for the result to be recorded (`subagent/remote-run`).
    pub(crate) fn wind_down(&self) -> Duration {
        self.cancel_grace + Duration::from_secs(1)
    }
}

/// `delegate_KEY`, with characters a tool name cannot hold replaced by `_`.
pub(crate) fn default_tool_name(key: &str) -> String {
    let safe: String =
        key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    format!("delegate_{safe}")
}

impl fmt::Debug for ExternalAgentConfig {
    // Environment values and arguments may hold secrets: only their names and count are shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("ExternalAgentConfig")
            .field("name", &self.name)
            .field("tool_name", &self.tool_name)
            .field("command", &self.command)
            .field("args", &self.args.len())
            .field("env", &env)
            .field("cwd", &self.cwd)
            .field("permission", &self.permission)
            .field("startup_timeout", &self.startup_timeout)
            .field("turn_timeout", &self.turn_timeout)
            .field("cancel_grace", &self.cancel_grace)
            .field("kill_grace", &self.kill_grace)
            .field("sandbox", &self.sandbox.as_ref().map(|s| s.policy.id()))
            .finish_non_exhaustive()
    }
}

/// The `acp:NAME` provider: no start-time capabilities, no continuable children.
pub struct AcpProvider {
    config: Arc<ExternalAgentConfig>,
    /// The ACP client that speaks to the agent process.
    agent: Arc<dyn RemoteAgent>,
    /// Where `forward` asks (the parent's editor).
    editor: Option<Arc<dyn PermissionPrompt>>,
}

impl AcpProvider {
    /// The provider of `config`, speaking to its processes through `agent` (`acp::external_agents`).
    pub fn new(config: ExternalAgentConfig, agent: Arc<dyn RemoteAgent>) -> Self {
        AcpProvider { config: Arc::new(config), agent, editor: None }
    }

    /// Asks `editor` the questions `forward` passes on.
    pub fn forwarding_to(mut self, editor: Arc<dyn PermissionPrompt>) -> Self {
        self.editor = Some(editor);
        self
    }

    pub fn config(&self) -> &ExternalAgentConfig {
        &self.config
    }
}

impl SubagentProvider for AcpProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    fn inherits_parent_context(&self) -> bool {
        false
    }

    fn wind_down(&self) -> Option<Duration> {
        Some(self.config.wind_down())
    }

    fn start(&self, resolved: ResolvedStart) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        let config = self.config.clone();
        let ResolvedStart { request, .. } = resolved;
        let forward = match (config.permission, &self.editor) {
            (AcpPermission::Forward, Some(editor)) => Some(Forward {
                editor: editor.clone(),
                session_id: request.parent.header.id.clone(),
                call_id: request.call_id.clone().unwrap_or_else(|| format!("{}-run", config.tool_name)),
                call: CallShown {
                    title: external_title(&config.tool_name, request.label.as_deref()),
                    tool: config.tool_name.clone(),
                    access: Access::Delegate,
                },
                cancel: request.cancel.clone(),
            }),
            _ => None,
        };
        start_run(config, self.agent.clone(), request, forward).boxed()
    }
}

/// The child's working directory: configured, else the parent's, else this process's.
fn working_dir(config: &ExternalAgentConfig, parent: &SessionHeader) -> PathBuf {
    config
        .cwd
        .clone()
        .or_else(|| parent.cwd.as_ref().map(PathBuf::from))
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// One run's parts once the process is up: the process, the connection and the answers.
struct Connection {
    process: AgentProcess,
    session: Box<dyn RemoteSession>,
    answers: Arc<Answers>,
}

/// Spawns the child and completes the handshake; a failure reaps the child before it returns.
async fn start_run(
    config: Arc<ExternalAgentConfig>,
    agent: Arc<dyn RemoteAgent>,
    request: StartRequest,
    forward: Option<Forward>,
) -> Result<SubagentRun, SubagentError> {
    let cwd = working_dir(&config, &request.parent.header);
    let (process, stdin, stdout) = AgentProcess::spawn(&config, &cwd)?;
    let root = std::fs::canonicalize(&cwd).unwrap_or_else(|_| cwd.clone());
    let answers =
        Arc::new(Answers::new(&config.name, config.permission, forward, request.progress.clone(), root.clone()));
    let session = agent.connect(&config.name, &root, stdin, stdout, answers.clone()).await.map_err(|cause| {
        SubagentError::new(ErrorCode::StartFailed, format!("subagent provider \"{}\": {cause}", config.name))
    })?;
    let mut conn = Connection { process, session, answers };
    let deadline = Instant::now() + config.startup_timeout;
    let offer = FileOffer { read: config.permission.allows_reads(), write: conn.answers.serves_writes() };
    let started = tokio::select! {
        started = conn.session.start(&cwd, offer, deadline) => started.map_err(Some),
        () = request.cancel.cancelled() => Err(None),
    };
    let session_id = match started {
        Ok(id) => id,
        Err(failure) => {
            let (code, cause) = conn.describe(failure, config.startup_timeout).await;
            conn.shutdown(Instant::now() + config.cancel_grace, config.kill_grace).await;
            let message = format!("subagent provider \"{}\": {cause}", config.name);
            tracing::warn!("{message}");
            return Err(SubagentError::new(code, message));
        }
    };
    tracing::debug!(provider = %config.name, child_session = %session_id, "child agent started");
    let (tx, result) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let stop = CancellationToken::new();
    let run = Run {
        conn,
        config: config.clone(),
        session_id,
        prompt: request.prompt,
        cancel: request.cancel,
        stop: stop.clone(),
    };
    tokio::spawn(async move {
        run.drive(tx).await;
        let _ = done_tx.send(());
    });
    Ok(SubagentRun {
        id: format!("acp-{}", uuid::Uuid::new_v4()),
        local: false,
        cwd: None,
        result,
        dispose: Box::new(move || {
            // Ends a run still going, then waits until the child is reaped.
            stop.cancel();
            async move {
                // The run's task always reaps the child; it is gone once the task is.
                let _ = done_rx.await;
                Ok(())
            }
            .boxed()
        }),
    })
}

/// Why a run stopped waiting for the prompt's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interrupt {
    /// The request's token (the parent's turn was cancelled).
    Cancelled,
    /// The run was disposed before it ended.
    Disposed,
    /// `turn_timeout` passed.
    TimedOut,
}

/// How the prompt ended.
enum Ending {
    Answered(Result<RemoteStop, Failure>),
    /// Interrupted; with the prompt's answer when it came within the grace.
    Interrupted(Interrupt, Option<Result<RemoteStop, Failure>>),
}

/// A started run: the connection after the handshake and the task.
struct Run {
    conn: Connection,
    config: Arc<ExternalAgentConfig>,
    session_id: String,
    prompt: Vec<Value>,
    cancel: CancellationToken,
    stop: CancellationToken,
}

impl Run {
    /// Sends the prompt, waits for its answer (or cancels the child), delivers the result, and
    /// then ends the child.
    async fn drive(self, tx: oneshot::Sender<Result<SubagentResult, SubagentError>>) {
        let Run { mut conn, config, session_id, prompt, cancel, stop } = self;
        let (ending, eof_deadline) = {
            let answer = conn.session.prompt(&session_id, prompt);
            tokio::pin!(answer);
            let turn_timeout = config.turn_timeout;
            let limit = async move {
                match turn_timeout {
                    Some(limit) => tokio::time::sleep(limit).await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::pin!(limit);
            let first = tokio::select! {
                result = &mut answer => Ok(result),
                () = cancel.cancelled() => Err(Interrupt::Cancelled),
                () = stop.cancelled() => Err(Interrupt::Disposed),
                () = &mut limit => Err(Interrupt::TimedOut),
            };
            match first {
                Ok(result) => (Ending::Answered(result), Instant::now() + config.cancel_grace),
                Err(why) => {
                    tracing::debug!(provider = %config.name, ?why, "cancelling the child agent's turn");
                    let deadline = Instant::now() + config.cancel_grace;
                    let _ = tokio::time::timeout_at(deadline, conn.session.cancel(&session_id)).await;
                    let _ = tokio::time::timeout_at(deadline, conn.session.close()).await;
                    // A well-behaved agent still answers the prompt (`cancelled`) before it exits.
                    let late = tokio::time::timeout_at(deadline, &mut answer).await.ok();
                    (Ending::Interrupted(why, late), deadline)
                }
            }
        };
        let result = conn.conclude(&config, &session_id, ending).await;
        let _ = tx.send(Ok(result));
        conn.shutdown(eof_deadline, config.kill_grace).await;
    }
}

impl Connection {
    /// The error code and cause of a failed start (`None`: cancelled).
    async fn describe(&mut self, failure: Option<StartFailure>, startup_timeout: Duration) -> (ErrorCode, String) {
        let cause = match failure {
            None => {
                return (ErrorCode::Cancelled, "the run was cancelled before the child agent started".to_string());
            }
            Some(StartFailure::Timeout(method)) => {
                format!("the child agent did not answer {method} within {}", seconds_text(startup_timeout))
            }
            Some(StartFailure::Refused { method, code, message }) => answered_error(method, code, &message),
            Some(StartFailure::Other(cause)) => cause,
            Some(StartFailure::Violated(reason)) => format!("the child agent {reason} during the handshake"),
            Some(StartFailure::Broken(reason)) => match self.process.exit_within(EXIT_PROBE).await {
                Some(status) => format!("the child agent exited ({}) during the handshake", describe_status(status)),
                None => format!("the child agent {reason} during the handshake"),
            },
        };
        (ErrorCode::StartFailed, self.process.with_stderr(cause))
    }

    /// The run's result from how the prompt ended.
    async fn conclude(&mut self, config: &ExternalAgentConfig, session_id: &str, ending: Ending) -> SubagentResult {
        let (stop_reason, error) = match ending {
            Ending::Answered(Ok(stop)) => stop_reason_of(&stop),
            Ending::Answered(Err(Failure::Rpc { code, message })) => {
                (StopReason::Error, Some(answered_error("session/prompt", code, &message)))
            }
            Ending::Answered(Err(Failure::Invalid(cause))) => (StopReason::Error, Some(cause)),
            Ending::Answered(Err(Failure::Violated(reason))) => {
                let cause = format!("the child agent {reason} during its turn");
                (StopReason::Error, Some(self.process.with_stderr(cause)))
            }
            Ending::Answered(Err(Failure::Broken(reason))) => {
                let cause = match self.process.exit_within(EXIT_PROBE).await {
                    Some(status) => format!("the child agent exited ({}) during its turn", describe_status(status)),
                    None => format!("the child agent {reason} during its turn"),
                };
                (StopReason::Error, Some(self.process.with_stderr(cause)))
            }
            Ending::Interrupted(Interrupt::TimedOut, _) => {
                let limit = seconds_text(config.turn_timeout.unwrap_or_default());
                (StopReason::Error, Some(format!("the child agent did not finish its turn within {limit}")))
            }
            // The child finished before the cancellation reached it.
            Ending::Interrupted(_, Some(Ok(RemoteStop::EndTurn))) => (StopReason::Completed, None),
            Ending::Interrupted(..) => (StopReason::Aborted, None),
        };
        SubagentResult {
            output: self.answers.output(),
            structured: None,
            stop_reason,
            // Named as a start failure is: the model may hold several agents' runs.
            failure: error.as_ref().map(|cause| format!("subagent provider \"{}\": {cause}", config.name)),
            remote: Some(RemoteRun {
                provider: config.name.clone(),
                command: config.program_name(),
                child_session_id: session_id.to_string(),
                error,
            }),
        }
    }

    /// Ends the child: closes its stdin, waits for it until `eof_deadline`, then kills its
    /// process group and waits `kill_grace`.
    async fn shutdown(self, eof_deadline: Instant, kill_grace: Duration) {
        let Connection { process, session, .. } = self;
        let _ = tokio::time::timeout_at(eof_deadline, session.close()).await;
        process.shutdown(eof_deadline, kill_grace).await;
        drop(session);
    }
}

/// The child's stop reason, and the failure detail for one kin does not map.
fn stop_reason_of(stop: &RemoteStop) -> (StopReason, Option<String>) {
    match stop {
        RemoteStop::EndTurn => (StopReason::Completed, None),
        RemoteStop::MaxTokens => (StopReason::MaxTokens, None),
        RemoteStop::Cancelled => (StopReason::Aborted, None),
        RemoteStop::Refusal => (StopReason::Refusal, None),
        RemoteStop::Other(other) => {
            let other = cut(other, MAX_ERROR_TEXT_BYTES);
            (StopReason::Error, Some(format!("the child agent's turn ended with stop reason {other:?}")))
        }
    }
}

/// The cause of the agent's JSON-RPC error answer to `method`: its message cut to
/// `MAX_ERROR_TEXT_BYTES`, with a note of the rest.
fn answered_error(method: &str, code: i64, message: &str) -> String {
    format!("the child agent answered {method} with error {code}: {}", cut(message, MAX_ERROR_TEXT_BYTES))
}

fn seconds_text(duration: Duration) -> String {
    format!("{}s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_map_to_dsh_reasons() {
        let of = |stop: RemoteStop| stop_reason_of(&stop).0;
        assert_eq!(of(RemoteStop::EndTurn), StopReason::Completed);
        assert_eq!(of(RemoteStop::MaxTokens), StopReason::MaxTokens);
        assert_eq!(of(RemoteStop::Cancelled), StopReason::Aborted);
        assert_eq!(of(RemoteStop::Refusal), StopReason::Refusal);
        let other = stop_reason_of(&RemoteStop::Other("max_turn_requests".into()));
        assert_eq!(
            other,
            (StopReason::Error, Some("the child agent's turn ended with stop reason \"max_turn_requests\"".into()))
        );
    }

    #[test]
    fn a_long_error_or_stop_reason_from_the_agent_is_cut_and_says_so() {
        let long = "r".repeat(1 << 20);
        let note = format!("[... {} more bytes not shown ...]", (1 << 20) - MAX_ERROR_TEXT_BYTES);
        let kept = "r".repeat(MAX_ERROR_TEXT_BYTES);
        let (_, cause) = stop_reason_of(&RemoteStop::Other(long.clone()));
        let cut_reason = format!("{kept}\n{note}");
        let quoted = format!("{cut_reason:?}");
        assert_eq!(cause, Some(format!("the child agent's turn ended with stop reason {quoted}")));
        let cause = answered_error("session/prompt", -32603, &long);
        assert_eq!(cause, format!("the child agent answered session/prompt with error -32603: {kept}\n{note}"));
        let short = answered_error("initialize", -32600, "bad request");
        assert_eq!(short, "the child agent answered initialize with error -32600: bad request");
    }

    #[test]
    fn config_defaults_and_secret_free_debug() {
        let mut config = ExternalAgentConfig::new("my.agent", "/usr/local/bin/codex-acp");
        config.env.push(("OPENAI_API_KEY".into(), "sk-secret".into()));
        config.args.push("--token=secret".into());
        assert_eq!((config.name.as_str(), config.tool_name.as_str()), ("acp:my.agent", "delegate_my_agent"));
        assert_eq!(config.program_name(), "codex-acp");
        assert_eq!(config.cancel_grace, Duration::from_secs(6));
        assert_eq!(config.kill_grace, Duration::from_secs(3));
        assert_eq!(config.wind_down(), Duration::from_secs(7), "a cancelled run's result is waited for");
        let debug = format!("{config:?}");
        assert!(debug.contains("OPENAI_API_KEY") && !debug.contains("secret"), "{debug}");
    }
}
