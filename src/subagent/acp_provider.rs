//! The `acp` provider (dsh-design.md §1.7, issue 8): an external ACP agent process (another kin,
//! a third-party agent, or `ssh host kin acp`) as a one-shot child. A run spawns the configured
//! command, speaks newline-delimited JSON-RPC on its stdin/stdout as an ACP client
//! (`initialize`, `session/new`, `session/prompt`), collects the child's `agent_message_chunk`
//! text as the output, reports each tool call the child starts as progress on the delegating
//! call, and maps its stop reason. The child's own requests are answered under the
//! configured permission policy: `session/request_permission`, `fs/read_text_file` and
//! `fs/write_text_file` (served from the run's working directory, never outside it); anything
//! else is method-not-found.
//!
//! The child has no local session: the run id is minted here (`acp-<uuid>`), the run is not
//! listed, and the delegation tool records it in the parent's log (`subagent/remote-run`).
//! Cancellation sends `session/cancel` and closes stdin, waits `cancel_grace`, then kills the
//! child's process group and waits `kill_grace`; every path reaps the child.
//!
//! `forward` asks the parent's editor: the child's permission requests become requests on the
//! parent's session and the delegating tool call (the runtime's editor lets the session's
//! permission mode answer first), and the answer is passed back as the child's matching option. Reads inside the working directory are served; a write inside it is served
//! right after the editor allowed one of the child's edits (or allowed them always), else the
//! editor is asked about that write. A provider built without an editor answers `forward` like
//! `allow-reads`; the runtime's asks the connected client, and with none connected every
//! question is a rejection.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::tools::external_title;
use super::{
    Capabilities, ErrorCode, RemoteRun, ResolvedStart, StartRequest, StopReason, SubagentError, SubagentProvider,
    SubagentResult, SubagentRun,
};
use crate::permission::{CallShown, PermissionAnswer, PermissionPrompt, PermissionRequest};
use crate::session::SessionHeader;
use crate::tools::{Access, Progress};

/// The ACP protocol version kin speaks as a client.
pub const PROTOCOL_VERSION: u64 = 1;
/// How long `initialize` plus `session/new` may take by default.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a child may take to exit after its stdin closes (dsh's `disposeEofGraceMs`).
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(6);
/// How long to wait for the child after killing it (dsh's `disposeGraceMs`).
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(3);
/// Stderr lines kept for error messages.
const STDERR_TAIL: usize = 8;
/// How long a broken connection waits for the child's exit status, to name it in the error.
const EXIT_PROBE: Duration = Duration::from_millis(500);

// JSON-RPC and ACP error codes of the answers to the child's requests.
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;
const RESOURCE_NOT_FOUND: i64 = -32002;

/// How the child's own requests are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcpPermission {
    /// Every permission request is rejected and every file request refused.
    Reject,
    /// Reads inside the working directory are served and read/search permission requests
    /// allowed; writes and every other permission request are rejected.
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

    fn allows_reads(self) -> bool {
        matches!(self, AcpPermission::AllowReads | AcpPermission::Forward)
    }
}

/// One configured external agent (`[acp_agents.NAME]`).
#[derive(Clone)]
pub struct AcpAgentConfig {
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
}

impl AcpAgentConfig {
    /// The agent `key` (provider `acp:KEY`, tool `delegate_KEY`), policy `reject`, default timeouts.
    pub fn new(key: &str, command: impl Into<String>) -> Self {
        AcpAgentConfig {
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

/// `delegate_KEY`, with characters a tool name cannot hold replaced by `_`.
pub fn default_tool_name(key: &str) -> String {
    let safe: String =
        key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    format!("delegate_{safe}")
}

impl fmt::Debug for AcpAgentConfig {
    // Environment values and arguments may hold secrets: only their names and count are shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("AcpAgentConfig")
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
            .finish_non_exhaustive()
    }
}

/// The `acp:NAME` provider: no start-time capabilities, no continuable children.
pub struct AcpProvider {
    config: Arc<AcpAgentConfig>,
    /// Where `forward` asks (the parent's editor).
    editor: Option<Arc<dyn PermissionPrompt>>,
}

impl AcpProvider {
    pub fn new(config: AcpAgentConfig) -> Self {
        AcpProvider { config: Arc::new(config), editor: None }
    }

    /// Asks `editor` the questions `forward` passes on.
    pub fn forwarding_to(mut self, editor: Arc<dyn PermissionPrompt>) -> Self {
        self.editor = Some(editor);
        self
    }

    pub fn config(&self) -> &AcpAgentConfig {
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
        start_run(config, request, forward).boxed()
    }
}

/// The child's working directory: configured, else the parent's, else this process's.
fn working_dir(config: &AcpAgentConfig, parent: &SessionHeader) -> PathBuf {
    config
        .cwd
        .clone()
        .or_else(|| parent.cwd.as_ref().map(PathBuf::from))
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// Spawns the child and completes the handshake; a failure reaps the child before it returns.
async fn start_run(
    config: Arc<AcpAgentConfig>,
    request: StartRequest,
    forward: Option<Forward>,
) -> Result<SubagentRun, SubagentError> {
    let cwd = working_dir(&config, &request.parent.header);
    let mut conn = Connection::spawn(&config, &cwd, forward, request.progress.clone())?;
    let deadline = Instant::now() + config.startup_timeout;
    let session_id = match conn.rpc.handshake(&cwd, deadline, &request.cancel).await {
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
                let _ = done_rx.await;
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
    Answered(Result<Value, Failure>),
    /// Interrupted; with the prompt's answer when it came within the grace.
    Interrupted(Interrupt, Option<Result<Value, Failure>>),
}

/// A started run: the connection after the handshake and the task.
struct Run {
    conn: Connection,
    config: Arc<AcpAgentConfig>,
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
        let params = json!({"sessionId": session_id, "prompt": prompt});
        let (ending, eof_deadline) = {
            let answer = conn.rpc.request("session/prompt", params);
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
                    let cancel_params = json!({"sessionId": session_id});
                    let _ = tokio::time::timeout_at(deadline, conn.rpc.notify("session/cancel", cancel_params)).await;
                    let _ = tokio::time::timeout_at(deadline, conn.rpc.close_stdin()).await;
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

/// A request that did not get a result.
#[derive(Debug, Clone)]
enum Failure {
    /// A JSON-RPC error answer.
    Rpc { code: i64, message: String },
    /// The connection broke; the text completes "the child agent …".
    Broken(String),
}

/// Why the handshake failed.
enum StartFailure {
    Broken(String),
    Refused { method: &'static str, code: i64, message: String },
    Timeout(&'static str),
    Cancelled,
    Other(String),
}

type Waiter = oneshot::Sender<Result<Value, Failure>>;

#[derive(Default)]
struct State {
    waiters: HashMap<u64, Waiter>,
    /// Why the connection is unusable (the child closed its stdout or broke the protocol).
    broken: Option<String>,
    /// The child's session (set after `session/new`): only its chunks count.
    session_id: Option<String>,
    output: String,
    stderr_tail: VecDeque<String>,
    /// Writes the editor allowed through `forward` and the child has not made yet.
    write_grants: u32,
    /// The editor allowed the child's edits always.
    writes_always: bool,
}

/// Where `forward` asks: the parent's editor, on the parent's session and the delegating tool
/// call; the run's cancellation withdraws an open question.
struct Forward {
    editor: Arc<dyn PermissionPrompt>,
    session_id: String,
    call_id: String,
    /// How the editor shows the delegating call, shown again once a question was answered.
    call: CallShown,
    cancel: CancellationToken,
}

/// What the reader tasks and the run share.
struct Shared {
    provider: String,
    policy: AcpPermission,
    /// Set for `forward` when there is an editor to ask.
    forward: Option<Forward>,
    /// The delegating call's progress: each tool call the child starts is reported there.
    progress: Option<Progress>,
    /// The real working directory: file requests must stay inside it.
    root: PathBuf,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the connection broken and fails every pending request.
    fn break_with(&self, reason: String) {
        let (reason, waiters) = {
            let mut state = self.lock();
            let reason = state.broken.get_or_insert(reason).clone();
            let waiters: Vec<Waiter> = state.waiters.drain().map(|(_, w)| w).collect();
            (reason, waiters)
        };
        tracing::debug!(provider = %self.provider, "child agent connection ended: {reason}");
        for waiter in waiters {
            let _ = waiter.send(Err(Failure::Broken(reason.clone())));
        }
    }

    fn broken_reason(&self) -> String {
        self.lock().broken.clone().unwrap_or_else(|| "closed the connection".to_string())
    }

    fn response(&self, id: &Value, frame: &Value) {
        let waiter = id.as_u64().and_then(|id| self.lock().waiters.remove(&id));
        let Some(waiter) = waiter else {
            tracing::debug!(provider = %self.provider, %id, "ignoring an answer to no pending request");
            return;
        };
        let outcome = match frame.get("error").filter(|e| !e.is_null()) {
            Some(error) => Err(Failure::Rpc {
                code: error["code"].as_i64().unwrap_or(0),
                message: error["message"].as_str().unwrap_or("(no message)").to_string(),
            }),
            None => Ok(frame.get("result").cloned().unwrap_or(Value::Null)),
        };
        let _ = waiter.send(outcome);
    }

    fn notification(&self, method: &str, params: &Value) {
        if method != "session/update" {
            tracing::debug!(provider = %self.provider, method, "ignoring a notification from the child agent");
            return;
        }
        let update = &params["update"];
        let mut state = self.lock();
        if state.session_id.is_none() || state.session_id.as_deref() != params["sessionId"].as_str() {
            return;
        }
        match update["sessionUpdate"].as_str() {
            Some("agent_message_chunk") if update["content"]["type"] == "text" => {
                state.output.push_str(update["content"]["text"].as_str().unwrap_or(""));
            }
            Some("tool_call") => {
                let title = update["title"].as_str().filter(|t| !t.trim().is_empty());
                if let (Some(progress), Some(title)) = (&self.progress, title) {
                    progress.report(format!("{}: {title}", self.provider));
                }
            }
            _ => {}
        }
    }

    fn stderr_line(&self, line: String) {
        tracing::debug!(provider = %self.provider, "child agent stderr: {line}");
        let mut state = self.lock();
        if state.stderr_tail.len() == STDERR_TAIL {
            state.stderr_tail.pop_front();
        }
        state.stderr_tail.push_back(line);
    }

    fn stderr_tail(&self) -> String {
        let state = self.lock();
        state.stderr_tail.iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" | ")
    }
}

/// The child's stdin, shared by the run and the reader (which answers the child's requests).
#[derive(Clone)]
struct Writer(Arc<tokio::sync::Mutex<Option<ChildStdin>>>);

impl Writer {
    async fn send(&self, frame: &Value) -> Result<(), String> {
        let mut line = frame.to_string();
        line.push('\n');
        let mut guard = self.0.lock().await;
        let stdin = guard.as_mut().ok_or_else(|| "had its stdin closed".to_string())?;
        stdin.write_all(line.as_bytes()).await.map_err(|e| format!("could not be written to ({e})"))?;
        stdin.flush().await.map_err(|e| format!("could not be written to ({e})"))
    }

    /// Closes the child's stdin (end of input asks an ACP agent to exit).
    async fn close(&self) {
        self.0.lock().await.take();
    }
}

/// The JSON-RPC side of a connection (no process handle, so borrowing it across awaits only
/// needs plainly `Sync` parts).
struct Rpc {
    writer: Writer,
    shared: Arc<Shared>,
    next_id: AtomicU64,
}

/// One child process and its JSON-RPC connection.
struct Connection {
    child: Child,
    /// The process group the child leads (spawned with `process_group(0)`).
    pgid: Option<libc::pid_t>,
    rpc: Rpc,
    reader: JoinHandle<()>,
    stderr: Option<JoinHandle<()>>,
}

impl Connection {
    fn spawn(
        config: &AcpAgentConfig,
        cwd: &Path,
        forward: Option<Forward>,
        progress: Option<Progress>,
    ) -> Result<Connection, SubagentError> {
        let mut command = Command::new(&config.command);
        command
            .args(&config.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        for (key, value) in &config.env {
            command.env(key, value);
        }
        // A remote working directory (ssh) need not exist here.
        if cwd.is_dir() {
            command.current_dir(cwd);
        }
        let start_failed = |cause: String| {
            SubagentError::new(ErrorCode::StartFailed, format!("subagent provider \"{}\": {cause}", config.name))
        };
        let mut child =
            command.spawn().map_err(|e| start_failed(format!("cannot start the command {:?}: {e}", config.command)))?;
        let pgid = child.id().and_then(|id| libc::pid_t::try_from(id).ok()).filter(|pid| *pid > 1);
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(start_failed("the child agent's pipes are missing".into()));
        };
        let shared = Arc::new(Shared {
            provider: config.name.clone(),
            policy: config.permission,
            forward,
            progress,
            root: std::fs::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf()),
            state: Mutex::new(State::default()),
        });
        let writer = Writer(Arc::new(tokio::sync::Mutex::new(Some(stdin))));
        let reader = tokio::spawn(read_stdout(stdout, writer.clone(), shared.clone()));
        let stderr = tokio::spawn(read_stderr(stderr, shared.clone()));
        let rpc = Rpc { writer, shared, next_id: AtomicU64::new(1) };
        Ok(Connection { child, pgid, rpc, reader, stderr: Some(stderr) })
    }
}

impl Rpc {
    /// Sends a request and waits for its answer (or for the connection to break).
    async fn request(&self, method: &str, params: Value) -> Result<Value, Failure> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.shared.lock();
            if let Some(reason) = &state.broken {
                return Err(Failure::Broken(reason.clone()));
            }
            state.waiters.insert(id, tx);
        }
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if let Err(e) = self.writer.send(&frame).await {
            self.shared.lock().waiters.remove(&id);
            // The reader's reason (the child closed its stdout) says more than a broken pipe.
            let known = self.shared.lock().broken.clone();
            return Err(Failure::Broken(known.unwrap_or(e)));
        }
        match rx.await {
            Ok(outcome) => outcome,
            Err(_) => Err(Failure::Broken(self.shared.broken_reason())),
        }
    }

    async fn notify(&self, method: &str, params: Value) {
        let frame = json!({"jsonrpc": "2.0", "method": method, "params": params});
        if let Err(e) = self.writer.send(&frame).await {
            tracing::debug!(provider = %self.shared.provider, method, "cannot notify the child agent: it {e}");
        }
    }

    async fn close_stdin(&self) {
        self.writer.close().await;
    }

    /// One handshake request under the startup deadline and the caller's cancellation.
    async fn step(
        &self,
        method: &'static str,
        params: Value,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<Value, StartFailure> {
        tokio::select! {
            outcome = tokio::time::timeout_at(deadline, self.request(method, params)) => match outcome {
                Err(_) => Err(StartFailure::Timeout(method)),
                Ok(Ok(result)) => Ok(result),
                Ok(Err(Failure::Rpc { code, message })) => Err(StartFailure::Refused { method, code, message }),
                Ok(Err(Failure::Broken(reason))) => Err(StartFailure::Broken(reason)),
            },
            () = cancel.cancelled() => Err(StartFailure::Cancelled),
        }
    }

    /// `initialize` (protocol 1; the fs methods the policy serves; no terminal), then
    /// `session/new` in `cwd`; returns the child's session id.
    async fn handshake(
        &self,
        cwd: &Path,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<String, StartFailure> {
        let fs =
            json!({"readTextFile": self.shared.policy.allows_reads(), "writeTextFile": self.shared.forward.is_some()});
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {"fs": fs, "terminal": false},
            "clientInfo": {"name": "kin", "version": env!("CARGO_PKG_VERSION")},
        });
        let init = self.step("initialize", params, deadline, cancel).await?;
        match init.get("protocolVersion").and_then(Value::as_u64) {
            Some(PROTOCOL_VERSION) => {}
            Some(other) => {
                return Err(StartFailure::Other(format!(
                    "the child agent speaks ACP protocol version {other}; kin speaks version {PROTOCOL_VERSION}"
                )));
            }
            None => {
                return Err(StartFailure::Other(format!(
                    "the child agent's initialize answer has no protocolVersion: {}",
                    excerpt(&init.to_string())
                )));
            }
        }
        let params = json!({"cwd": cwd.display().to_string(), "mcpServers": []});
        let created = self.step("session/new", params, deadline, cancel).await?;
        let Some(id) = created.get("sessionId").and_then(Value::as_str).map(str::to_string) else {
            return Err(StartFailure::Other(format!(
                "the child agent's session/new answer has no sessionId: {}",
                excerpt(&created.to_string())
            )));
        };
        self.shared.lock().session_id = Some(id.clone());
        Ok(id)
    }
}

impl Connection {
    /// The error code and cause of a failed start.
    async fn describe(&mut self, failure: StartFailure, startup_timeout: Duration) -> (ErrorCode, String) {
        let cause = match failure {
            StartFailure::Cancelled => {
                return (ErrorCode::Cancelled, "the run was cancelled before the child agent started".to_string());
            }
            StartFailure::Timeout(method) => {
                format!("the child agent did not answer {method} within {}", seconds_text(startup_timeout))
            }
            StartFailure::Refused { method, code, message } => {
                format!("the child agent answered {method} with error {code}: {message}")
            }
            StartFailure::Other(cause) => cause,
            StartFailure::Broken(reason) => match self.exit_within(EXIT_PROBE).await {
                Some(status) => format!("the child agent exited ({}) during the handshake", describe_status(status)),
                None => format!("the child agent {reason} during the handshake"),
            },
        };
        (ErrorCode::StartFailed, self.with_stderr(cause))
    }

    /// `message` followed by the child's last stderr lines, when it wrote any.
    fn with_stderr(&self, message: String) -> String {
        let tail = self.rpc.shared.stderr_tail();
        if tail.is_empty() { message } else { format!("{message}; its stderr ended with: {tail}") }
    }

    /// The child's exit status, when it exits within `wait`.
    async fn exit_within(&mut self, wait: Duration) -> Option<ExitStatus> {
        let status = tokio::time::timeout(wait, self.child.wait()).await.ok().and_then(Result::ok);
        if status.is_some()
            && let Some(task) = self.stderr.take()
        {
            // Let the last stderr lines arrive for the error message.
            let _ = tokio::time::timeout(Duration::from_millis(200), task).await;
        }
        status
    }

    /// The run's result from how the prompt ended.
    async fn conclude(&mut self, config: &AcpAgentConfig, session_id: &str, ending: Ending) -> SubagentResult {
        let (stop_reason, error) = match ending {
            Ending::Answered(Ok(answer)) => stop_reason_of(&answer),
            Ending::Answered(Err(Failure::Rpc { code, message })) => (
                StopReason::Error,
                Some(format!("the child agent answered session/prompt with error {code}: {message}")),
            ),
            Ending::Answered(Err(Failure::Broken(reason))) => {
                let cause = match self.exit_within(EXIT_PROBE).await {
                    Some(status) => format!("the child agent exited ({}) during its turn", describe_status(status)),
                    None => format!("the child agent {reason} during its turn"),
                };
                (StopReason::Error, Some(self.with_stderr(cause)))
            }
            Ending::Interrupted(Interrupt::TimedOut, _) => {
                let limit = seconds_text(config.turn_timeout.unwrap_or_default());
                (StopReason::Error, Some(format!("the child agent did not finish its turn within {limit}")))
            }
            // The child finished before the cancellation reached it.
            Ending::Interrupted(_, Some(Ok(answer))) if stop_reason_of(&answer).0 == StopReason::Completed => {
                (StopReason::Completed, None)
            }
            Ending::Interrupted(..) => (StopReason::Aborted, None),
        };
        SubagentResult {
            output: self.rpc.shared.lock().output.clone(),
            structured: None,
            stop_reason,
            remote: Some(RemoteRun {
                provider: config.name.clone(),
                command: config.program_name(),
                child_session_id: session_id.to_string(),
                error,
            }),
        }
    }

    /// Ends the child: closes its stdin, waits for it until `eof_deadline`, then kills its
    /// process group and waits `kill_grace`. The child is reaped on every path.
    async fn shutdown(mut self, eof_deadline: Instant, kill_grace: Duration) {
        let _ = tokio::time::timeout_at(eof_deadline, self.rpc.writer.close()).await;
        let exited = matches!(tokio::time::timeout_at(eof_deadline, self.child.wait()).await, Ok(Ok(_)));
        if !exited {
            tracing::debug!(provider = %self.rpc.shared.provider, "killing the child agent");
            self.kill_group();
            let _ = self.child.start_kill();
            if !matches!(tokio::time::timeout(kill_grace, self.child.wait()).await, Ok(Ok(_))) {
                tracing::warn!(
                    provider = %self.rpc.shared.provider,
                    "the child agent did not exit within {kill_grace:?} of being killed"
                );
            }
        }
        self.reader.abort();
        if let Some(task) = self.stderr.take() {
            let _ = tokio::time::timeout(Duration::from_millis(200), task).await;
        }
    }

    /// SIGKILL to the child's process group (the child and whatever it started), while the child
    /// is not yet reaped (so the group id cannot have been reused).
    fn kill_group(&self) {
        if self.child.id().is_none() {
            return;
        }
        if let Some(pgid) = self.pgid {
            // SAFETY: kill(2) only takes integers; a negative pid addresses the process group the
            // unreaped child leads.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Connection {
    // A run dropped mid-way (its future abandoned) still kills what it started; tokio reaps the
    // child (`kill_on_drop`).
    fn drop(&mut self) {
        self.kill_group();
        self.reader.abort();
    }
}

/// Reads the child's stdout: answers, notifications and the child's own requests; anything
/// that is not JSON-RPC breaks the connection.
async fn read_stdout(stdout: ChildStdout, writer: Writer, shared: Arc<Shared>) {
    let mut lines = BufReader::new(stdout).lines();
    let reason = loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                if line.trim().is_empty() {
                    continue;
                }
                if let Err(reason) = handle_line(&line, &writer, &shared).await {
                    break reason;
                }
            }
            Ok(None) => break "closed its stdout".to_string(),
            Err(e) => break format!("wrote unreadable output ({e})"),
        }
    };
    shared.break_with(reason);
}

async fn handle_line(line: &str, writer: &Writer, shared: &Shared) -> Result<(), String> {
    let garbage = || format!("wrote a line that is not JSON-RPC: {}", excerpt(line));
    let frame: Value = serde_json::from_str(line).map_err(|_| garbage())?;
    let method = frame.get("method").and_then(Value::as_str);
    let id = frame.get("id").filter(|id| !id.is_null());
    match (method, id) {
        (Some(method), Some(id)) => {
            let reply = match answer(shared, method, &frame["params"]).await {
                Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                Err((code, message)) => {
                    tracing::debug!(provider = %shared.provider, method, "refusing the child agent's request: {message}");
                    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
                }
            };
            if let Err(e) = writer.send(&reply).await {
                tracing::debug!(provider = %shared.provider, method, "cannot answer the child agent: it {e}");
            }
            Ok(())
        }
        (Some(method), None) => {
            shared.notification(method, &frame["params"]);
            Ok(())
        }
        (None, Some(id)) if frame.get("result").is_some() || frame.get("error").is_some() => {
            shared.response(id, &frame);
            Ok(())
        }
        _ => Err(garbage()),
    }
}

/// Logs the child's stderr line by line (lossy UTF-8) and keeps the last lines.
async fn read_stderr(stderr: ChildStderr, shared: Arc<Shared>) {
    let mut reader = BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => shared.stderr_line(String::from_utf8_lossy(&buf).trim_end().to_string()),
        }
    }
}

/// Answers one request of the child under the permission policy.
async fn answer(shared: &Shared, method: &str, params: &Value) -> Result<Value, (i64, String)> {
    match method {
        "session/request_permission" => Ok(match &shared.forward {
            Some(forward) => forward_permission(shared, forward, params).await,
            None => permission_answer(shared.policy, params),
        }),
        "fs/read_text_file" => read_text_file(shared, params).await,
        "fs/write_text_file" => write_text_file(shared, params).await,
        _ => Err((METHOD_NOT_FOUND, format!("Method not found: {method}"))),
    }
}

/// The outcome of the child's `session/request_permission`: an allow option for a read or a
/// search when the policy allows reads, else a reject option, else `cancelled`.
fn permission_answer(policy: AcpPermission, params: &Value) -> Value {
    let kind = params["toolCall"]["kind"].as_str().unwrap_or("");
    let allow = policy.allows_reads() && matches!(kind, "read" | "search");
    select_option(params, if allow { &["allow_once", "allow_always"] } else { &["reject_once", "reject_always"] })
}

/// The first of the child's options whose kind is in `preferred` (in that order), else
/// `cancelled`.
fn select_option(params: &Value, preferred: &[&str]) -> Value {
    let options: &[Value] = params["options"].as_array().map(Vec::as_slice).unwrap_or_default();
    let chosen = preferred
        .iter()
        .find_map(|want| options.iter().find(|o| o["kind"] == *want).and_then(|o| o["optionId"].as_str()));
    match chosen {
        Some(option_id) => json!({"outcome": {"outcome": "selected", "optionId": option_id}}),
        None => json!({"outcome": {"outcome": "cancelled"}}),
    }
}

/// `forward`: asks the editor about the child's tool call and passes the answer on as the
/// child's option of the same kind. An allowed edit lets the child write once (always, for
/// "allow always"); a run cancelled while the question is open answers `cancelled`.
async fn forward_permission(shared: &Shared, forward: &Forward, params: &Value) -> Value {
    let call = &params["toolCall"];
    let kind = call["kind"].as_str().unwrap_or("other");
    let title = call["title"].as_str().filter(|t| !t.trim().is_empty()).unwrap_or("a tool call");
    let raw_input = call.get("rawInput").cloned().unwrap_or(Value::Null);
    let in_workspace = names_only_workspace_paths(&shared.root, call);
    let access = crate::acp::forwarded_access(kind, named_paths(&shared.root, call));
    let asked = Asked { kind, title, raw_input, access, in_workspace };
    let Some(answer) = ask_editor(shared, forward, asked).await else {
        return json!({"outcome": {"outcome": "cancelled"}});
    };
    let allowed: &[&str] = match answer {
        PermissionAnswer::AllowOnce => &["allow_once", "allow_always"],
        PermissionAnswer::AllowAlways => &["allow_always", "allow_once"],
        PermissionAnswer::RejectOnce | PermissionAnswer::Dismissed => &["reject_once", "reject_always"],
        PermissionAnswer::RejectAlways => &["reject_always", "reject_once"],
    };
    if kind == "edit" {
        let mut state = shared.lock();
        match answer {
            PermissionAnswer::AllowOnce => state.write_grants += 1,
            PermissionAnswer::AllowAlways => state.writes_always = true,
            PermissionAnswer::RejectOnce | PermissionAnswer::RejectAlways | PermissionAnswer::Dismissed => {}
        }
    }
    select_option(params, allowed)
}

/// The paths the child's tool call names (its `locations`, and a `path` / `file_path` /
/// `filePath` of its raw input), resolved against the working directory.
fn named_paths(root: &Path, call: &Value) -> Vec<PathBuf> {
    let located = call["locations"].as_array().into_iter().flatten().filter_map(|l| l["path"].as_str());
    let input = &call["rawInput"];
    let named = ["path", "file_path", "filePath"].into_iter().filter_map(|key| input[key].as_str());
    located.chain(named).map(|p| crate::tools::paths::resolve(root, p)).collect()
}

/// Whether the child's tool call names paths and all of them lie in the working directory.
fn names_only_workspace_paths(root: &Path, call: &Value) -> bool {
    let paths = named_paths(root, call);
    !paths.is_empty() && paths.iter().all(|p| crate::tools::paths::inside_workspace(&[root.to_path_buf()], p))
}

/// What the child asks about.
struct Asked<'a> {
    /// Its call's ACP kind.
    kind: &'a str,
    title: &'a str,
    raw_input: Value,
    access: Access,
    /// Every path it names lies in the working directory (and it names some).
    in_workspace: bool,
}

/// One question to the editor, titled with the provider's name; `None` when the run was
/// cancelled first.
async fn ask_editor(shared: &Shared, forward: &Forward, asked: Asked<'_>) -> Option<PermissionAnswer> {
    let request = PermissionRequest {
        session_id: forward.session_id.clone(),
        call_id: forward.call_id.clone(),
        tool: asked.kind.to_string(),
        title: format!("{}: {}", shared.provider, asked.title),
        raw_input: asked.raw_input,
        access: asked.access,
        cwd: shared.root.clone(),
        in_workspace: asked.in_workspace,
        on_behalf_of: Some(forward.call.clone()),
    };
    tokio::select! {
        answer = forward.editor.ask(request) => Some(answer),
        () = forward.cancel.cancelled() => None,
    }
}

/// `fs/write_text_file` (`path`, `content`) inside the working directory, under `forward` only:
/// served when the editor allowed the child's edit just before (or always), else after the
/// editor allows this write.
async fn write_text_file(shared: &Shared, params: &Value) -> Result<Value, (i64, String)> {
    let Some(forward) = &shared.forward else {
        return Err((
            INTERNAL_ERROR,
            format!(
                "writing files is refused: subagent provider \"{}\" has permission \"{}\", which allows no writes",
                shared.provider,
                shared.policy.id()
            ),
        ));
    };
    let path = params["path"]
        .as_str()
        .ok_or_else(|| (INVALID_PARAMS, "fs/write_text_file needs a string path".to_string()))?;
    let content = params["content"]
        .as_str()
        .ok_or_else(|| (INVALID_PARAMS, "fs/write_text_file needs a string content".to_string()))?;
    let target = confined_new(&shared.root, Path::new(path)).await?;
    let granted = {
        let mut state = shared.lock();
        let granted = state.writes_always || state.write_grants > 0;
        state.write_grants = state.write_grants.saturating_sub(1);
        granted
    };
    if !granted {
        let title = format!("Write {path}");
        let access = Access::Edit { paths: vec![target.clone()] };
        let asked = Asked { kind: "edit", title: &title, raw_input: json!({"path": path}), access, in_workspace: true };
        let answer = ask_editor(shared, forward, asked).await;
        match answer {
            Some(PermissionAnswer::AllowOnce) => {}
            Some(PermissionAnswer::AllowAlways) => shared.lock().writes_always = true,
            Some(PermissionAnswer::RejectOnce | PermissionAnswer::RejectAlways | PermissionAnswer::Dismissed)
            | None => {
                return Err((INTERNAL_ERROR, format!("the user rejected writing {path}")));
            }
        }
    }
    tokio::fs::write(&target, content).await.map_err(|e| (INTERNAL_ERROR, format!("cannot write {path}: {e}")))?;
    Ok(Value::Null)
}

/// `fs/read_text_file` (`path`, optional 1-based `line` and `limit`) inside the working directory.
async fn read_text_file(shared: &Shared, params: &Value) -> Result<Value, (i64, String)> {
    if !shared.policy.allows_reads() {
        return Err((
            INTERNAL_ERROR,
            format!(
                "reading files is refused: subagent provider \"{}\" has permission \"{}\"",
                shared.provider,
                shared.policy.id()
            ),
        ));
    }
    let path =
        params["path"].as_str().ok_or_else(|| (INVALID_PARAMS, "fs/read_text_file needs a string path".to_string()))?;
    let real = confined(&shared.root, Path::new(path)).await?;
    let text = tokio::fs::read_to_string(&real).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => (RESOURCE_NOT_FOUND, format!("Resource not found: {path}")),
        _ => (INTERNAL_ERROR, format!("cannot read {path}: {e}")),
    })?;
    let (line, limit) = (params["line"].as_u64(), params["limit"].as_u64());
    let content = if line.is_none() && limit.is_none() {
        text
    } else {
        let skip = usize::try_from(line.unwrap_or(1).saturating_sub(1)).unwrap_or(usize::MAX);
        let take = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
        text.split_inclusive('\n').skip(skip).take(take).collect()
    };
    Ok(json!({"content": content}))
}

/// The real path of `path` when it is absolute and, symlinks resolved, inside `root` (itself
/// resolved).
async fn confined(root: &Path, path: &Path) -> Result<PathBuf, (i64, String)> {
    if !path.is_absolute() {
        return Err((INVALID_PARAMS, format!("the path must be absolute: {}", path.display())));
    }
    match tokio::fs::canonicalize(path).await {
        Ok(real) if real.starts_with(root) => Ok(real),
        Ok(_) => Err((
            INTERNAL_ERROR,
            format!("{} is outside the working directory {} of this subagent run", path.display(), root.display()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err((RESOURCE_NOT_FOUND, format!("Resource not found: {}", path.display())))
        }
        Err(e) => Err((INTERNAL_ERROR, format!("cannot resolve {}: {e}", path.display()))),
    }
}

/// Where a write to `path` lands: its directory resolved (symlinks included) must be inside
/// `root`, and an existing file there must not be a symlink.
async fn confined_new(root: &Path, path: &Path) -> Result<PathBuf, (i64, String)> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err((INVALID_PARAMS, format!("not a file path: {}", path.display())));
    };
    let target = confined(root, dir).await?.join(name);
    match tokio::fs::symlink_metadata(&target).await {
        Ok(meta) if meta.file_type().is_symlink() => {
            Err((INTERNAL_ERROR, format!("{} is a symbolic link; kin does not write through it", path.display())))
        }
        _ => Ok(target),
    }
}

/// The child's stop reason, and the failure detail for an unknown or missing one.
fn stop_reason_of(answer: &Value) -> (StopReason, Option<String>) {
    match answer.get("stopReason").and_then(Value::as_str) {
        Some("end_turn") => (StopReason::Completed, None),
        Some("max_tokens") => (StopReason::MaxTokens, None),
        Some("cancelled") => (StopReason::Aborted, None),
        Some("refusal") => (StopReason::Refusal, None),
        Some(other) => (StopReason::Error, Some(format!("the child agent's turn ended with stop reason {other:?}"))),
        None => (StopReason::Error, Some("the child agent's session/prompt answer has no stopReason".to_string())),
    }
}

fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "unknown status".to_string(),
    }
}

fn seconds_text(duration: Duration) -> String {
    format!("{}s", duration.as_secs_f64())
}

/// The start of `text`, quoted, for error messages.
fn excerpt(text: &str) -> String {
    const MAX: usize = 200;
    let mut cut: String = text.chars().take(MAX).collect();
    if text.chars().nth(MAX).is_some() {
        cut.push('…');
    }
    format!("{cut:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Value {
        json!([
            {"optionId": "a1", "name": "Allow", "kind": "allow_once"},
            {"optionId": "r1", "name": "Reject", "kind": "reject_once"},
        ])
    }

    #[test]
    fn permission_requests_follow_the_policy() {
        let read = json!({"toolCall": {"toolCallId": "t", "kind": "read"}, "options": options()});
        let edit = json!({"toolCall": {"toolCallId": "t", "kind": "edit"}, "options": options()});
        let selected = |id: &str| json!({"outcome": {"outcome": "selected", "optionId": id}});
        assert_eq!(permission_answer(AcpPermission::Reject, &read), selected("r1"));
        assert_eq!(permission_answer(AcpPermission::AllowReads, &read), selected("a1"));
        assert_eq!(permission_answer(AcpPermission::Forward, &read), selected("a1"));
        assert_eq!(permission_answer(AcpPermission::AllowReads, &edit), selected("r1"));
        let bare = json!({"toolCall": {"toolCallId": "t"}, "options": []});
        assert_eq!(permission_answer(AcpPermission::Reject, &bare), json!({"outcome": {"outcome": "cancelled"}}));
    }

    #[test]
    fn stop_reasons_map_to_dsh_reasons() {
        let of = |r: &str| stop_reason_of(&json!({"stopReason": r})).0;
        assert_eq!(of("end_turn"), StopReason::Completed);
        assert_eq!(of("max_tokens"), StopReason::MaxTokens);
        assert_eq!(of("cancelled"), StopReason::Aborted);
        assert_eq!(of("refusal"), StopReason::Refusal);
        assert_eq!(of("max_turn_requests"), StopReason::Error);
        assert_eq!(stop_reason_of(&json!({})).0, StopReason::Error);
    }

    #[test]
    fn config_defaults_and_secret_free_debug() {
        let mut config = AcpAgentConfig::new("my.agent", "/usr/local/bin/codex-acp");
        config.env.push(("OPENAI_API_KEY".into(), "sk-secret".into()));
        config.args.push("--token=secret".into());
        assert_eq!((config.name.as_str(), config.tool_name.as_str()), ("acp:my.agent", "delegate_my_agent"));
        assert_eq!(config.program_name(), "codex-acp");
        assert_eq!(config.cancel_grace, Duration::from_secs(6));
        assert_eq!(config.kill_grace, Duration::from_secs(3));
        let debug = format!("{config:?}");
        assert!(debug.contains("OPENAI_API_KEY") && !debug.contains("secret"), "{debug}");
    }

    fn shared(policy: AcpPermission, root: &Path) -> Shared {
        Shared {
            provider: "acp:t".into(),
            policy,
            forward: None,
            progress: None,
            root: root.to_path_buf(),
            state: Mutex::new(State::default()),
        }
    }

    /// An editor that answers every question with `answer` and counts them.
    struct Answers(PermissionAnswer, Arc<AtomicU64>);

    impl PermissionPrompt for Answers {
        fn ask(&self, _: PermissionRequest) -> BoxFuture<'static, PermissionAnswer> {
            self.1.fetch_add(1, Ordering::Relaxed);
            let answer = self.0;
            async move { answer }.boxed()
        }
    }

    fn forwarding(root: &Path, answer: PermissionAnswer) -> (Shared, Arc<AtomicU64>) {
        let asked = Arc::new(AtomicU64::new(0));
        let editor = Arc::new(Answers(answer, asked.clone()));
        let forward = Forward {
            editor,
            session_id: "p".into(),
            call_id: "c".into(),
            call: CallShown { title: "delegate_t: task".into(), tool: "delegate_t".into(), access: Access::Delegate },
            cancel: CancellationToken::new(),
        };
        (Shared { forward: Some(forward), ..shared(AcpPermission::Forward, root) }, asked)
    }

    #[test]
    fn a_call_is_in_the_workspace_only_when_every_path_it_names_is() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap().join("ws");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
        let inside = root.join("a.txt").display().to_string();
        let call = |locations: Vec<&str>, input: Value| {
            let locations: Vec<Value> = locations.into_iter().map(|p| json!({"path": p})).collect();
            json!({"toolCallId": "t", "locations": locations, "rawInput": input})
        };
        assert!(names_only_workspace_paths(&root, &call(vec![&inside], json!({}))));
        assert!(names_only_workspace_paths(&root, &call(vec![], json!({"path": "src/new.rs"}))));
        assert!(!names_only_workspace_paths(&root, &call(vec![], json!({"command": "ls"}))), "no path named");
        assert!(!names_only_workspace_paths(&root, &call(vec![&inside, "/etc/passwd"], json!({}))));
        assert!(!names_only_workspace_paths(&root, &call(vec![], json!({"file_path": "../x"}))));
        assert!(!names_only_workspace_paths(&root, &call(vec![], json!({"filePath": "etc/passwd"}))), "a symlink out");
    }

    #[tokio::test]
    async fn forwarded_writes_stay_inside_the_working_directory_and_follow_the_editor() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root = base.join("ws");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(base.join("secret.txt"), "s").unwrap();
        std::os::unix::fs::symlink(base.join("secret.txt"), root.join("link.txt")).unwrap();
        let write = |path: PathBuf| json!({"path": path, "content": "x"});
        let (allows, asked) = forwarding(&root, PermissionAnswer::AllowOnce);
        for escape in [base.join("new.txt"), root.join("../new.txt"), root.join("link.txt")] {
            let refused = answer(&allows, "fs/write_text_file", &write(escape)).await.unwrap_err();
            assert!(
                refused.1.contains("outside the working directory") || refused.1.contains("symbolic link"),
                "{refused:?}"
            );
        }
        assert_eq!(std::fs::read_to_string(base.join("secret.txt")).unwrap(), "s");
        assert!(!base.join("new.txt").exists());
        let relative = answer(&allows, "fs/write_text_file", &json!({"path": "a.txt", "content": "x"})).await;
        assert_eq!(relative.unwrap_err().0, INVALID_PARAMS);
        assert_eq!(asked.load(Ordering::Relaxed), 0, "nothing refused was asked about");
        // Each write without an allowed edit before it is asked about.
        for n in 1..=2 {
            assert_eq!(answer(&allows, "fs/write_text_file", &write(root.join("a.txt"))).await, Ok(Value::Null));
            assert_eq!(asked.load(Ordering::Relaxed), n);
        }
        assert_eq!(std::fs::read_to_string(root.join("a.txt")).unwrap(), "x");
        // "Allow always" is asked once.
        let (always, asked) = forwarding(&root, PermissionAnswer::AllowAlways);
        for _ in 0..3 {
            assert_eq!(answer(&always, "fs/write_text_file", &write(root.join("b.txt"))).await, Ok(Value::Null));
        }
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        let (rejects, _) = forwarding(&root, PermissionAnswer::Dismissed);
        let refused = answer(&rejects, "fs/write_text_file", &write(root.join("c.txt"))).await.unwrap_err();
        assert!(refused.1.contains("the user rejected writing"), "{refused:?}");
        assert!(!root.join("c.txt").exists());
    }

    #[tokio::test]
    async fn file_reads_stay_inside_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root = base.join("ws");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("a.txt"), "one\ntwo\nthree\n").unwrap();
        std::fs::write(base.join("secret.txt"), "s").unwrap();
        std::os::unix::fs::symlink(base.join("secret.txt"), root.join("link.txt")).unwrap();
        let path = root.join("a.txt").display().to_string();
        let reads = shared(AcpPermission::AllowReads, &root);
        let whole = answer(&reads, "fs/read_text_file", &json!({"path": path})).await.unwrap();
        assert_eq!(whole, json!({"content": "one\ntwo\nthree\n"}));
        let window = answer(&reads, "fs/read_text_file", &json!({"path": path, "line": 2, "limit": 1})).await.unwrap();
        assert_eq!(window, json!({"content": "two\n"}));
        for escape in [base.join("secret.txt"), root.join("../secret.txt"), root.join("link.txt")] {
            let refused = answer(&reads, "fs/read_text_file", &json!({"path": escape})).await.unwrap_err();
            assert!(refused.1.contains("outside the working directory"), "{refused:?}");
        }
        let relative = answer(&reads, "fs/read_text_file", &json!({"path": "a.txt"})).await.unwrap_err();
        assert_eq!(relative.0, INVALID_PARAMS);
        let write = json!({"path": path, "content": "x"});
        assert!(answer(&reads, "fs/write_text_file", &write).await.unwrap_err().1.contains("refused"));
        let rejects = shared(AcpPermission::Reject, &root);
        assert!(answer(&rejects, "fs/read_text_file", &json!({"path": path})).await.is_err());
        assert_eq!(answer(&rejects, "terminal/create", &json!({})).await.unwrap_err().0, -32601);
    }
}
