//! `kin run`: one headless turn for scripts and CI. The run is an ACP client of kin's own server
//! (`serve`) over an in-process channel, so it goes through exactly the runtime, agent loop,
//! permission gate and session log an editor gets, and `--output stream-json` prints the very
//! `session/update`s an editor would see. Nobody is there to answer a permission question: the
//! run refuses each one and says so on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ClientSessionCapabilities, ContentBlock, InitializeRequest,
    ListSessionsRequest, NewSessionRequest, NoticeCapabilities, PermissionOptionKind, PromptRequest,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse, ResumeSessionRequest,
    SelectedPermissionOutcome, SessionModeId, SessionNotification, SessionUpdate, SetSessionModeRequest, StateUpdate,
    StopReason, SubagentCapabilities, TextContent, ToolCallStatus,
};
use agent_client_protocol::{Agent, Channel, Client, on_receive_notification, on_receive_request};
use serde_json::{Value, json};

use super::convert::RETRY_THOUGHT_PREFIX;
use crate::permission::PermissionMode;
use crate::runtime::Runtime;

/// What `kin run` prints on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The reply text as it streams; progress on stderr.
    Text,
    /// One JSON object at the end (text, stop reason, session id, usage).
    Json,
    /// One JSON object per line: every `session/update`, refused permission requests, then the result.
    StreamJson,
}

/// Which session the turn goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    New,
    /// A stored session by id.
    Resume(String),
    /// The newest top-level session whose cwd is the run's cwd.
    Continue,
}

/// One `kin run`.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub prompt: String,
    pub cwd: PathBuf,
    pub output: Output,
    pub target: Target,
    pub mode: PermissionMode,
    /// The log is a file (`--log-file`): what ends the run badly is written there too.
    pub logs_to_file: bool,
}

/// How a run ended; each has its own exit code (documented in README).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The turn ended with `end_turn`.
    Completed,
    /// The turn failed (model, persistence or tool infrastructure), or the session could not be opened.
    Failed,
    /// The model was stopped: it ran out of tokens or steps, or refused.
    Refused,
    /// The turn was cancelled (SIGINT).
    Cancelled,
    /// The turn was cancelled by SIGTERM (a CI job's cancel, `timeout`).
    Terminated,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Completed => 0,
            Exit::Failed => 1,
            Exit::Refused => 4,
            Exit::Cancelled => 130,
            Exit::Terminated => 143,
        }
    }
}

/// Runs one turn and prints it; returns how it ended.
pub async fn run(runtime: Arc<Runtime>, request: RunRequest) -> anyhow::Result<Exit> {
    let (agent_end, client_end) = Channel::duplex();
    let server = tokio::spawn(super::serve(runtime, agent_end));
    let printer = Arc::new(Printer::new(&request));
    let (on_update, on_permission) = (printer.clone(), printer.clone());
    let outcome = Client
        .v1()
        .name("kin-run")
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                on_update.update(&n);
                Ok(())
            },
            on_receive_notification!(),
        )
        .on_receive_request(
            async move |req: RequestPermissionRequest, responder, _cx| {
                on_permission.refused(&req);
                let reject = req.options.iter().find(|o| o.kind == PermissionOptionKind::RejectOnce);
                let outcome = match reject {
                    Some(option) => {
                        RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(option.option_id.clone()))
                    }
                    None => RequestPermissionOutcome::Cancelled,
                };
                responder.respond(RequestPermissionResponse::new(outcome))
            },
            on_receive_request!(),
        )
        .connect_with(client_end, {
            let printer = printer.clone();
            async move |cx: ConnectionTo<Agent>| Ok(turn(&cx, &request, &printer).await)
        })
        .await;
    // The connection is closed: the server shuts the runtime down (flushing every log).
    if let Err(e) = server.await {
        tracing::error!("the in-process ACP server failed: {e}");
    }
    let outcome = outcome.map_err(|e| anyhow::anyhow!("kin run: {e}"))?;
    let exit = match outcome {
        Ok((session, result, stopped)) => match (printer.finish(&session, result), stopped) {
            (Exit::Cancelled, Some(Exit::Terminated)) => Exit::Terminated,
            (exit, _) => exit,
        },
        Err(message) => {
            printer.failed_to_start(&message);
            Exit::Failed
        }
    };
    Ok(exit)
}

/// What the prompt answered: a stop reason, or the turn's error message.
type TurnResult = Result<StopReason, String>;

/// Opens the session and runs the turn; an error is a failure to open the session. With the
/// session and the prompt's answer comes the signal that cancelled the turn, if one did: the
/// first SIGINT or SIGTERM sends `session/cancel` (the turn ends, its text kept, the result
/// printed), a second signal exits at once.
async fn turn(
    cx: &ConnectionTo<Agent>,
    request: &RunRequest,
    printer: &Printer,
) -> Result<(String, TurnResult, Option<Exit>), String> {
    // Announced subagents show children's progress and give each turn a usage update; notices
    // (an MCP server that cannot be used) are notes, never part of the answer.
    let capabilities = ClientCapabilities::new()
        .subagents(SubagentCapabilities::new())
        .session(ClientSessionCapabilities::new().notices(NoticeCapabilities::new()));
    cx.send_request(InitializeRequest::new(ProtocolVersion::V1).client_capabilities(capabilities))
        .block_task()
        .await
        .map_err(|e| e.to_string())?;
    let session = open(cx, request).await?;
    printer.set_session(&session);
    // A stored session keeps its recorded mode unless the run says otherwise; the run's mode wins.
    cx.send_request(SetSessionModeRequest::new(session.clone(), SessionModeId::new(request.mode.id())))
        .block_task()
        .await
        .map_err(|e| e.to_string())?;
    let prompt =
        PromptRequest::new(session.clone(), vec![ContentBlock::Text(TextContent::new(request.prompt.clone()))]);
    let answer = cx.send_request(prompt).block_task();
    tokio::pin!(answer);
    let mut stopped: Option<Exit> = None;
    let result = loop {
        let signal = tokio::select! {
            answer = &mut answer => break answer.map(|r| r.stop_reason).map_err(|e| words(&e)),
            signal = next_signal(), if stopped.is_none() => signal,
        };
        let Some(signal) = signal else { continue };
        stopped = Some(signal);
        printer.note(match signal {
            Exit::Terminated => "terminated (SIGTERM): cancelling the turn (a second signal exits now)",
            _ => "interrupted: cancelling the turn (press Ctrl-C again to exit now)",
        });
        if let Err(e) = cx.send_notification(CancelNotification::new(session.clone())) {
            tracing::debug!("cancel not delivered: {e}");
        }
        // A second signal exits at once; the log keeps what was already written.
        tokio::spawn(async {
            if let Some(second) = next_signal().await {
                std::process::exit(i32::from(second.code()));
            }
        });
    };
    Ok((session, result, stopped))
}

/// The next SIGINT (`Exit::Cancelled`) or SIGTERM (`Exit::Terminated`); `None` when neither can
/// be listened for.
async fn next_signal() -> Option<Exit> {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut interrupt, mut terminate) = (signal(SignalKind::interrupt()).ok()?, signal(SignalKind::terminate()).ok()?);
    tokio::select! {
        _ = interrupt.recv() => Some(Exit::Cancelled),
        _ = terminate.recv() => Some(Exit::Terminated),
    }
}

/// The session id the turn goes to: a new one, or a stored one resumed.
async fn open(cx: &ConnectionTo<Agent>, request: &RunRequest) -> Result<String, String> {
    let id = match &request.target {
        Target::New => {
            let created = cx.send_request(NewSessionRequest::new(request.cwd.clone())).block_task().await;
            return created.map(|r| r.session_id.0.to_string()).map_err(|e| words(&e));
        }
        Target::Resume(id) => id.clone(),
        Target::Continue => {
            let listed = cx
                .send_request(ListSessionsRequest::new().cwd(request.cwd.clone()))
                .block_task()
                .await
                .map_err(|e| words(&e))?;
            let newest = listed.sessions.into_iter().next().ok_or_else(|| {
                format!(
                    "no stored session in {} to continue; run without --continue to start one",
                    request.cwd.display()
                )
            })?;
            newest.session_id.0.to_string()
        }
    };
    cx.send_request(ResumeSessionRequest::new(id.clone(), request.cwd.clone()))
        .block_task()
        .await
        .map_err(|e| words(&e))?;
    Ok(id)
}

/// What an error answer says, in its own words: the JSON-RPC code's name the SDK puts first
/// ("Internal error: ", "Resource not found: ") says nothing to the person running kin.
fn words(e: &agent_client_protocol::Error) -> String {
    ["Internal error: ", "Invalid params: ", "Resource not found: ", "Invalid request: ", "Authentication required: "]
        .iter()
        .find_map(|name| e.message.strip_prefix(name))
        .unwrap_or(&e.message)
        .to_string()
}

/// Prints what the run sees, in the chosen output.
struct Printer {
    output: Output,
    /// The run's permission mode (what a refusal suggests depends on it).
    mode: PermissionMode,
    /// The log is a file: failures are logged as well as printed.
    logs_to_file: bool,
    state: Mutex<State>,
    /// The first write to stdout that failed: nothing more is written after it, and `finish`
    /// says what it was (a reader that closed the pipe early is not a failure).
    stdout_failed: Mutex<Option<std::io::Error>>,
}

#[derive(Default)]
struct State {
    /// The top-level session, once known.
    session: Option<String>,
    /// The reply text so far.
    text: String,
    /// The last usage totals the server reported (`usage_update._meta.kin`).
    usage: Option<Value>,
    /// Children announced on the agent tree: id → (title, still running).
    children: Vec<(String, String, bool)>,
    /// Tool call titles by id, to name a call when it fails.
    titles: Vec<(String, String)>,
}

impl Printer {
    fn new(request: &RunRequest) -> Self {
        Printer {
            output: request.output,
            mode: request.mode,
            logs_to_file: request.logs_to_file,
            state: Mutex::new(State::default()),
            stdout_failed: Mutex::new(None),
        }
    }

    /// A failure that ends the run, in the log file too (on stderr it is printed once, by the
    /// caller).
    fn log_failure(&self, message: &str) {
        if self.logs_to_file {
            tracing::error!("kin run: {message}");
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_session(&self, id: &str) {
        self.state().session = Some(id.to_string());
    }

    /// One short progress line on stderr (text and json output; stream-json carries everything on stdout).
    fn note(&self, line: &str) {
        if self.output != Output::StreamJson {
            eprintln!("kin: {line}");
        }
    }

    fn json_line(&self, value: &Value) {
        self.write_out(format!("{value}\n").as_bytes());
    }

    /// `bytes` on stdout, flushed, unless a write to it failed before.
    fn write_out(&self, bytes: &[u8]) {
        let mut failed = self.stdout_failed.lock().unwrap_or_else(PoisonError::into_inner);
        if failed.is_none() {
            let mut out = std::io::stdout().lock();
            *failed = out.write_all(bytes).and_then(|()| out.flush()).err();
        }
    }

    fn update(&self, n: &SessionNotification) {
        if self.output == Output::StreamJson {
            self.json_line(&json!({"type": "session_update", "sessionId": n.session_id, "update": n.update}));
        }
        let id = n.session_id.0.to_string();
        let mut state = self.state();
        let top = state.session.as_deref() == Some(id.as_str());
        match &n.update {
            SessionUpdate::AgentMessageChunk(chunk) if top => {
                if let ContentBlock::Text(text) = &chunk.content {
                    state.text.push_str(&text.text);
                    if self.output == Output::Text {
                        self.write_out(text.text.as_bytes());
                    }
                }
            }
            SessionUpdate::AgentThoughtChunk(chunk) => {
                if let ContentBlock::Text(text) = &chunk.content
                    && text.text.starts_with(RETRY_THOUGHT_PREFIX)
                {
                    drop(state);
                    self.note(text.text.trim_end());
                }
            }
            SessionUpdate::Notice(notice) => {
                drop(state);
                let detail = notice.description.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
                self.note(&format!("{}{detail}", notice.title));
            }
            SessionUpdate::ToolCall(call) => {
                state.titles.push((call.tool_call_id.0.to_string(), call.title.clone()));
                let label = child_label(&state, &id, top);
                drop(state);
                self.note(&format!("{label}{}", call.title));
            }
            SessionUpdate::ToolCallUpdate(update) if update.fields.status == Some(ToolCallStatus::Failed) => {
                let call = update.tool_call_id.0.to_string();
                let title = update
                    .fields
                    .title
                    .clone()
                    .or_else(|| state.titles.iter().rev().find(|(c, _)| *c == call).map(|(_, t)| t.clone()));
                let content = serde_json::to_value(&update.fields.content).unwrap_or_default();
                let reason = first_text(&content).unwrap_or_default();
                let label = child_label(&state, &id, top);
                drop(state);
                self.note(&format!("{label}failed: {}: {reason}", title.unwrap_or(call)));
            }
            SessionUpdate::UsageUpdate(usage) if top => {
                state.usage = usage.meta.as_ref().and_then(|m| m.get("kin")).cloned();
            }
            SessionUpdate::SubagentUpdate(child) => {
                let child_id = child.session_id.0.to_string();
                let running = match child.state.value() {
                    Some(StateUpdate::Idle(_)) => Some(false),
                    Some(_) => Some(true),
                    None => None,
                };
                let title = child.title.value().cloned();
                let known = state.children.iter().position(|(c, _, _)| *c == child_id);
                match known {
                    Some(i) => {
                        if let Some(title) = title {
                            state.children[i].1 = title;
                        }
                        if let Some(running) = running {
                            state.children[i].2 = running;
                        }
                    }
                    None => {
                        let title = title.unwrap_or_else(|| child_id.clone());
                        state.children.push((child_id, title.clone(), running.unwrap_or(true)));
                        drop(state);
                        self.note(&format!("child started: {title}"));
                    }
                }
            }
            _ => {}
        }
    }

    fn refused(&self, req: &RequestPermissionRequest) {
        if self.output == Output::StreamJson {
            self.json_line(
                &json!({"type": "permission_refused", "sessionId": req.session_id, "toolCall": req.tool_call}),
            );
        }
        let title = req.tool_call.fields.title.clone().unwrap_or_else(|| req.tool_call.tool_call_id.0.to_string());
        // What would have let it run: a looser mode than the run's (commands and paths outside
        // the workspace ask even in accept-edits; a command confined by a sandbox does not).
        let allow = match self.mode {
            PermissionMode::Ask => "run with --permission-mode accept-edits (workspace edits) or bypass to allow it",
            PermissionMode::AcceptEdits | PermissionMode::ReadOnly | PermissionMode::Bypass => {
                "commands and paths outside the workspace ask even in accept-edits: run with --permission-mode \
                 bypass, or give commands a sandbox the kernel enforces (--sandbox workspace-write)"
            }
        };
        self.note(&format!("refused: {title}: kin run cannot ask for permission ({allow})"));
    }

    fn failed_to_start(&self, message: &str) {
        self.log_failure(message);
        match self.output {
            Output::Text => eprintln!("kin: {message}"),
            Output::Json | Output::StreamJson => {
                self.json_line(&json!({"type": "result", "stopReason": null, "error": message, "sessionId": null}))
            }
        }
    }

    /// Prints the end of the run and maps it to an exit: a turn that completed but whose reply
    /// could not be written (stdout full or failing, not closed by its reader) fails.
    fn finish(&self, session: &str, result: TurnResult) -> Exit {
        let exit = self.finish_printing(session, result);
        let failed = self.stdout_failed.lock().unwrap_or_else(PoisonError::into_inner).take();
        match failed {
            Some(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                eprintln!(
                    "kin: cannot write the reply to stdout: {e}; the session log keeps it (kin sessions show {session})"
                );
                if exit == Exit::Completed { Exit::Failed } else { exit }
            }
            _ => exit,
        }
    }

    fn finish_printing(&self, session: &str, result: TurnResult) -> Exit {
        if let Err(message) = &result {
            self.log_failure(&format!("{message} (session {session})"));
        }
        let state = self.state();
        let exit = match &result {
            Ok(StopReason::EndTurn) => Exit::Completed,
            Ok(StopReason::Cancelled) => Exit::Cancelled,
            Ok(_) => Exit::Refused,
            Err(_) => Exit::Failed,
        };
        let running: Vec<&(String, String, bool)> = state.children.iter().filter(|c| c.2).collect();
        match self.output {
            Output::Text => {
                if !state.text.is_empty() && !state.text.ends_with('\n') {
                    self.write_out(b"\n");
                }
                match &result {
                    Ok(StopReason::EndTurn) => {}
                    Ok(StopReason::MaxTurnRequests) => eprintln!(
                        "kin: the turn stopped: max_turn_requests (the model used every step; raise --max-steps or agent.max_steps)"
                    ),
                    Ok(reason) => eprintln!("kin: the turn stopped: {}", stop_reason_id(*reason)),
                    Err(message) => eprintln!("kin: {message}"),
                }
                for (id, title, _) in &running {
                    eprintln!("kin: background child {id} ({title}) was still running; its log keeps its work");
                }
                eprintln!("kin: session {session}");
            }
            Output::Json | Output::StreamJson => {
                let (reason, error) = match &result {
                    Ok(reason) => (json!(stop_reason_id(*reason)), Value::Null),
                    Err(message) => (Value::Null, json!(message)),
                };
                let running: Vec<Value> =
                    running.iter().map(|(id, title, _)| json!({"sessionId": id, "title": title})).collect();
                self.json_line(&json!({
                    "type": "result",
                    "text": state.text,
                    "stopReason": reason,
                    "error": error,
                    "sessionId": session,
                    "usage": state.usage.clone().unwrap_or(Value::Null),
                    "runningChildren": running,
                }));
            }
        }
        exit
    }
}

/// How a child's progress line starts ("" for the top-level session).
fn child_label(state: &State, session: &str, top: bool) -> String {
    if top {
        return String::new();
    }
    let title = state.children.iter().find(|(c, _, _)| c == session).map_or(session, |(_, t, _)| t.as_str());
    format!("[{title}] ")
}

/// The first line of text in a tool call's content (what the model read as the result).
fn first_text(content: &Value) -> Option<String> {
    match content {
        Value::Array(items) => items.iter().find_map(first_text),
        Value::Object(map) => match map.get("text") {
            Some(Value::String(text)) => Some(text.lines().next().unwrap_or_default().to_string()),
            _ => map.values().find_map(first_text),
        },
        _ => None,
    }
}

/// The ACP wire name of a stop reason.
fn stop_reason_id(reason: StopReason) -> String {
    serde_json::to_value(reason).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_use_their_wire_names() {
        assert_eq!(stop_reason_id(StopReason::EndTurn), "end_turn");
        assert_eq!(stop_reason_id(StopReason::MaxTokens), "max_tokens");
    }

    #[test]
    fn the_first_text_of_a_raw_output_names_the_failure() {
        let content = json!([{"type": "content", "content": {"type": "text", "text": "Error: denied\nmore"}}]);
        assert_eq!(first_text(&content).as_deref(), Some("Error: denied"));
    }
}
