//! One MCP server of a session: its start (once), its tools, its calls, its death (restarted
//! once, at the next step), and its close. Every failure is one notice for the user; none fails
//! the session.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, ClientRequest};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::connect::{self, Connection, StartError, StderrTail};
use super::result;
use super::session::McpNotice;
use super::spec::{ServerSpec, Transport, Trust};
use crate::tools::capture::{MAX_ERROR_TEXT_BYTES, cut};
use crate::tools::{ToolError, ToolOutput, args};

/// The most tools taken from one server (the rest are dropped, and the log says so).
const MAX_TOOLS: usize = 256;

/// A tool a server lists, as kin keeps it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Listed {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    pub input_schema: Value,
    /// The server says the tool only reads (`readOnlyHint: true`); counts only under trust.
    pub read_only_hint: bool,
}

impl Listed {
    fn from_rmcp(tool: &rmcp::model::Tool) -> Self {
        let annotations = tool.annotations.as_ref();
        Listed {
            name: tool.name.to_string(),
            title: tool.title.clone().or_else(|| annotations.and_then(|a| a.title.clone())),
            description: tool.description.as_ref().map(ToString::to_string),
            input_schema: Value::Object((*tool.input_schema).clone()),
            read_only_hint: annotations.and_then(|a| a.read_only_hint) == Some(true),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Starting,
    Ready,
    /// Could not start (or restart); its tools are gone for the session.
    Failed,
    /// Its connection ended; restarted at the next step if it was not restarted before.
    Lost,
    Closed,
}

struct State {
    phase: Phase,
    connection: Option<Arc<Connection>>,
    tools: Vec<Listed>,
    restarted: bool,
    /// A re-list failed: steps keep the tools listed before and do not ask again until then.
    relist_after: Option<tokio::time::Instant>,
}

/// How often an HTTP server is pinged during a call, and how long a ping may take, before the
/// call fails as the server's death.
const PING_EVERY: Duration = Duration::from_secs(5);
const PING_WITHIN: Duration = Duration::from_secs(5);

/// How long steps keep a server's earlier tools after a re-list of them failed (a server that
/// says its list changed and then never answers `tools/list` would hold every step for its
/// startup timeout).
const RELIST_BACKOFF: Duration = Duration::from_secs(300);

pub(super) struct Server {
    pub spec: ServerSpec,
    cwd: Option<PathBuf>,
    startup_timeout: Duration,
    tool_timeout: Duration,
    state: Mutex<State>,
    /// Cancelled once the first start has finished, however it ended.
    settled: CancellationToken,
    /// Cancelled when the server is closed: a start still running is abandoned.
    closing: CancellationToken,
    /// One refresh (re-list or restart) at a time: parent and child agents share the server.
    refreshing: tokio::sync::Mutex<()>,
    notices: UnboundedSender<McpNotice>,
    tail: Arc<StderrTail>,
}

impl Server {
    pub(super) fn new(
        spec: ServerSpec,
        cwd: Option<PathBuf>,
        startup_timeout: Duration,
        tool_timeout: Duration,
        notices: UnboundedSender<McpNotice>,
    ) -> Arc<Self> {
        Arc::new(Server {
            spec,
            cwd,
            startup_timeout,
            tool_timeout,
            state: Mutex::new(State {
                phase: Phase::Starting,
                connection: None,
                tools: Vec::new(),
                restarted: false,
                relist_after: None,
            }),
            settled: CancellationToken::new(),
            closing: CancellationToken::new(),
            refreshing: tokio::sync::Mutex::new(()),
            notices,
            tail: Arc::new(StderrTail::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn name(&self) -> &str {
        &self.spec.name
    }

    /// Starts the server in the background; `settled` resolves when the start has finished.
    pub(super) fn start(self: &Arc<Self>) {
        let server = self.clone();
        tokio::spawn(async move {
            match server.open_unless_closed().await {
                Some(Ok((connection, tools))) => server.ready(connection, tools).await,
                Some(Err(e)) => {
                    server.state().phase = Phase::Failed;
                    server.notify(format!("MCP server `{}` failed to start", server.name()), &e);
                }
                None => {}
            }
            server.settled.cancel();
        });
    }

    /// Marks a server that is never started (a transport kin does not support) as failed.
    pub(super) fn fail_unstarted(&self) {
        self.state().phase = Phase::Failed;
        self.settled.cancel();
    }

    /// Whether its first start is still under way.
    pub(super) fn is_starting(&self) -> bool {
        !self.settled.is_cancelled()
    }

    /// Waits until the first start has finished.
    pub(super) async fn settled(&self) {
        self.settled.cancelled().await;
    }

    /// `open`, abandoned (`None`, its process group killed) when the server is closed meanwhile.
    async fn open_unless_closed(&self) -> Option<Result<(Arc<Connection>, Vec<Listed>), StartError>> {
        tokio::select! {
            opened = self.open() => Some(opened),
            () = self.closing.cancelled() => None,
        }
    }

    /// Connects and lists the tools, all within the startup timeout.
    async fn open(&self) -> Result<(Arc<Connection>, Vec<Listed>), StartError> {
        let started = tokio::time::Instant::now();
        let cwd = self.cwd.as_deref();
        let connection = Arc::new(
            connect::connect(self.name(), &self.spec.transport, cwd, self.startup_timeout, self.tail.clone())
                .await
                .map_err(|e| self.redacted(e))?,
        );
        let left = self.startup_timeout.saturating_sub(started.elapsed()).max(Duration::from_secs(1));
        match list(&connection, left).await {
            Ok(Listing { tools, cut }) => {
                if let Some(cut) = cut {
                    let error = StartError { reason: cut, stderr: Vec::new() };
                    self.notify(format!("MCP server `{}` offers only some of its tools", self.name()), &error);
                }
                Ok((connection, tools))
            }
            Err(reason) => {
                connection.close().await;
                Err(self.redacted(StartError { reason, stderr: self.tail.lines() }))
            }
        }
    }

    /// `error` without the secrets of this server's transport (`Transport::redact`).
    fn redacted(&self, error: StartError) -> StartError {
        let transport = &self.spec.transport;
        StartError {
            reason: transport.redact(&error.reason).into_owned(),
            stderr: error.stderr.iter().map(|line| transport.redact(line).into_owned()).collect(),
        }
    }

    /// Takes a started connection, unless the server was closed meanwhile.
    async fn ready(&self, connection: Arc<Connection>, tools: Vec<Listed>) {
        let closed = {
            let mut state = self.state();
            if state.phase == Phase::Closed {
                true
            } else {
                state.phase = Phase::Ready;
                state.connection = Some(connection.clone());
                state.tools = tools;
                false
            }
        };
        if closed {
            connection.close().await;
        } else {
            tracing::info!(server = %self.name(), kind = self.spec.transport.kind(), "MCP server ready");
        }
    }

    fn notify(&self, title: String, error: &StartError) {
        tracing::warn!(server = %self.name(), "{title}: {}", error.reason);
        let _ = self.notices.send(McpNotice::new(self.name(), title, &error.reason, &error.stderr));
    }

    /// Brings the server up to date for a step: a lost server is restarted (once), the tools are
    /// listed (answered from the connection's cache unless the server said its list changed).
    /// Never fails: what goes wrong is a notice or a warning.
    pub(super) async fn refresh(&self) {
        let _one = self.refreshing.lock().await;
        let (phase, connection, restarted, backing_off) = {
            let state = self.state();
            let backing_off = state.relist_after.is_some_and(|after| tokio::time::Instant::now() < after);
            (state.phase, state.connection.clone(), state.restarted, backing_off)
        };
        match (phase, connection) {
            (Phase::Ready, Some(connection)) if connection.is_closed() => {
                self.lose(&connection).await;
                self.restart_if_allowed(restarted).await;
            }
            (Phase::Ready, Some(_)) if backing_off => {}
            (Phase::Ready, Some(connection)) => match list(&connection, self.startup_timeout).await {
                Ok(Listing { tools, .. }) => {
                    let mut state = self.state();
                    state.tools = tools;
                    state.relist_after = None;
                }
                Err(reason) => {
                    self.state().relist_after = Some(tokio::time::Instant::now() + RELIST_BACKOFF);
                    let reason = self.spec.transport.redact(&reason).into_owned();
                    let error = StartError { reason, stderr: self.tail.lines() };
                    let title = format!(
                        "MCP server `{}` changed its tools but could not list them; its earlier tools are kept, \
                         and it is asked again in {} minutes",
                        self.name(),
                        RELIST_BACKOFF.as_secs() / 60
                    );
                    self.notify(title, &error);
                }
            },
            (Phase::Lost, _) => self.restart_if_allowed(restarted).await,
            // Still starting (the step waited for the first start), given up, or closed.
            (Phase::Ready, None) | (Phase::Starting | Phase::Failed | Phase::Closed, _) => {}
        }
    }

    /// Marks the server lost (its connection ended) and closes what is left of it.
    async fn lose(&self, connection: &Arc<Connection>) {
        {
            let mut state = self.state();
            if state.phase != Phase::Ready || !state.connection.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
                return;
            }
            state.phase = Phase::Lost;
            state.connection = None;
            state.tools.clear();
        }
        tracing::warn!(server = %self.name(), "MCP server stopped");
        connection.close().await;
    }

    async fn restart_if_allowed(&self, restarted: bool) {
        if self.state().phase != Phase::Lost {
            return;
        }
        // An HTTP server is connected to again each time its connection ends (an answer over
        // the client's size limit ends it too, the server still up); a dead one fails to connect.
        let http = matches!(self.spec.transport, Transport::Http { .. });
        if restarted && !http {
            self.state().phase = Phase::Failed;
            let error = StartError {
                reason: "it was restarted once already, so it is not started again".into(),
                stderr: self.tail.lines(),
            };
            self.notify(format!("MCP server `{}` stopped again", self.name()), &error);
            return;
        }
        self.state().restarted = !http;
        match self.open_unless_closed().await {
            Some(Ok((connection, tools))) => {
                tracing::info!(server = %self.name(), "MCP server restarted");
                self.ready(connection, tools).await;
            }
            Some(Err(e)) => {
                self.state().phase = Phase::Failed;
                self.notify(format!("MCP server `{}` stopped and could not be restarted", self.name()), &e);
            }
            None => {}
        }
    }

    /// The tools offered now (after the server's tool filters).
    pub(super) fn tools(&self) -> Vec<Listed> {
        let state = self.state();
        if state.phase != Phase::Ready {
            return Vec::new();
        }
        state.tools.iter().filter(|t| self.spec.settings.offers(&t.name)).cloned().collect()
    }

    /// Whether the server's `readOnlyHint` counts (config `trust = "read-only-hints"`).
    pub(super) fn trusts_hints(&self) -> bool {
        self.spec.settings.trust == Trust::ReadOnlyHints
    }

    /// Calls `tool` with `arguments` (a JSON object), within the tool timeout; cancelling drops
    /// the request, which sends MCP `notifications/cancelled`.
    pub(super) async fn call(
        &self,
        tool: &str,
        arguments: Value,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let connection = {
            let state = self.state();
            match (&state.phase, &state.connection) {
                (Phase::Ready, Some(connection)) => connection.clone(),
                (Phase::Ready, None) | (Phase::Starting | Phase::Failed | Phase::Lost | Phase::Closed, _) => {
                    return Err(gone(self.name(), "it is not running"));
                }
            }
        };
        check_arguments(tool, &arguments)?;
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Value::Object(map) = arguments {
            params = params.with_arguments(map);
        }
        let request = tokio::time::timeout(self.tool_timeout, connection.peer.call_tool(params));
        let answer = tokio::select! {
            answer = request => answer,
            () = cancel.cancelled() => return Err(args::aborted()),
            // Over HTTP nothing tells kin the server died: the client waits on the call's stream.
            () = self.until_unreachable(&connection) => Ok(Err(ServiceError::TransportClosed)),
        };
        match answer {
            Ok(Ok(value)) => {
                let value = serde_json::to_value(&value).unwrap_or(Value::Null);
                result::map(&value, self.name(), tool)
            }
            Ok(Err(ServiceError::McpError(e))) => Err(mcp_error(
                format!("MCP server {} answered {tool} with error {}", self.name(), e.code.0),
                &e.message,
            )),
            // One request failed (an HTTP answer over the client's size limit, say), while the
            // connection holds: the call's failure, not the server's.
            Ok(Err(ServiceError::TransportSend(e))) if !connection.is_closed() => Err(mcp_error(
                format!("MCP server {} could not answer {tool}", self.name()),
                &self.spec.transport.redact(&error_chain(&e)),
            )),
            Ok(Err(ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                self.lose(&connection).await;
                Err(gone(
                    self.name(),
                    if matches!(self.spec.transport, Transport::Http { .. }) {
                        "the connection to it ended during the call (it stopped answering, or its answer was larger \
                         than the 16 MiB kin reads); kin connects to it again before the next step"
                    } else if self.state().restarted {
                        "it stopped during the call; it was restarted once already, so kin does not start it again"
                    } else {
                        "it stopped during the call; kin restarts it once before the next step"
                    },
                ))
            }
            Ok(Err(e)) => {
                Err(mcp_error(format!("MCP server {}", self.name()), &self.spec.transport.redact(&e.to_string())))
            }
            Err(_) => Err(ToolError::named(
                "McpError",
                "MCP_TIMEOUT",
                format!(
                    "the MCP tool {}/{tool} did not answer within {} s; the call was cancelled (raise tool_timeout_secs if it needs longer)",
                    self.name(),
                    self.tool_timeout.as_secs_f64()
                ),
            )),
        }
    }

    /// Resolves once an HTTP server cannot be reached during a call (a dead server: a ping every
    /// `PING_EVERY` that fails to reach it; one not answered within `PING_WITHIN` is a busy
    /// server, and the call waits on); never for a stdio server, whose end the connection sees.
    async fn until_unreachable(&self, connection: &Connection) {
        if !matches!(self.spec.transport, Transport::Http { .. }) {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(PING_EVERY).await;
            let ping = connection.peer.send_request(ClientRequest::PingRequest(Default::default()));
            match tokio::time::timeout(PING_WITHIN, ping).await {
                // An answer, even an error, or none yet from a busy server: the call waits on
                // (the tool timeout bounds a server that accepts and never answers).
                Ok(Ok(_)) | Ok(Err(ServiceError::McpError(_))) | Err(_) => {}
                // The request could not reach it (the connection is refused): it is gone.
                Ok(Err(_)) => return,
            }
        }
    }

    /// Closes the server (a grace, then its process group is killed); it stays closed. A start
    /// or restart still running is abandoned first.
    pub(super) async fn close(&self) {
        self.closing.cancel();
        let _no_refresh = self.refreshing.lock().await;
        self.settled().await;
        let connection = {
            let mut state = self.state();
            state.phase = Phase::Closed;
            state.tools.clear();
            state.connection.take()
        };
        if let Some(connection) = connection {
            connection.close().await;
        }
    }
}

/// `error` with its causes (`a: b: c`), as the HTTP client nests them.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

/// An `MCP_ERROR`: `what` (whose error, about what), then what the server said, cut to
/// `MAX_ERROR_TEXT_BYTES` with a note of the rest.
fn mcp_error(what: String, said: &str) -> ToolError {
    ToolError::named("McpError", "MCP_ERROR", format!("{what}: {}", cut(said, MAX_ERROR_TEXT_BYTES)))
}

/// A call's arguments must be a JSON object (or absent): MCP's `arguments` is one.
pub(super) fn check_arguments(tool: &str, arguments: &Value) -> Result<(), ToolError> {
    match arguments {
        Value::Object(_) | Value::Null => Ok(()),
        other => {
            Err(ToolError::new("INVALID_ARGUMENTS", format!("arguments for {tool} must be a JSON object, not {other}")))
        }
    }
}

fn gone(server: &str, why: &str) -> ToolError {
    ToolError::named("McpError", "MCP_SERVER_GONE", format!("MCP server {server} is unavailable: {why}"))
}

/// The most pages of `tools/list` followed.
const MAX_PAGES: usize = 16;

/// The tools the server lists (following up to 16 pages), within `timeout`, capped at 256.
async fn list(connection: &Connection, timeout: Duration) -> Result<Listing, String> {
    let pages = async {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = cursor.take().map(|c| rmcp::model::PaginatedRequestParams::default().with_cursor(Some(c)));
            let page = connection.peer.list_tools(params).await?;
            tools.extend(page.tools.iter().map(Listed::from_rmcp));
            match page.next_cursor {
                Some(next) if tools.len() < MAX_TOOLS => cursor = Some(next),
                more => {
                    cursor = more;
                    break;
                }
            }
        }
        Ok::<_, ServiceError>((tools, cursor.is_some()))
    };
    let (mut tools, more) = match tokio::time::timeout(timeout, pages).await {
        Ok(Ok(listed)) => listed,
        Ok(Err(e)) => return Err(format!("listing its tools failed: {}", cut(&e.to_string(), MAX_ERROR_TEXT_BYTES))),
        Err(_) => return Err(format!("listing its tools took longer than {:.1} s", timeout.as_secs_f64())),
    };
    let cut = (tools.len() > MAX_TOOLS || more).then(|| {
        let listed = if more { format!("more than {} tools", tools.len()) } else { format!("{} tools", tools.len()) };
        format!("it lists {listed}; kin offers the first {}", tools.len().min(MAX_TOOLS))
    });
    tools.truncate(MAX_TOOLS);
    Ok(Listing { tools, cut })
}

/// A server's tools as listed, and what was left out of them (more than `MAX_TOOLS`, or pages
/// past `MAX_PAGES`), said once when it starts.
struct Listing {
    tools: Vec<Listed>,
    cut: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_error_from_a_server_is_cut_and_says_so() {
        let said = "e".repeat(1 << 20);
        let error = mcp_error("MCP server s answered t with error -32603".into(), &said);
        assert_eq!(error.code, "MCP_ERROR");
        let kept = "e".repeat(MAX_ERROR_TEXT_BYTES);
        let note = format!("[... {} more bytes not shown ...]", (1 << 20) - MAX_ERROR_TEXT_BYTES);
        assert_eq!(error.message, format!("MCP server s answered t with error -32603: {kept}\n{note}"));
        let short = mcp_error("MCP server s".into(), "connection reset");
        assert_eq!(short.message, "MCP server s: connection reset");
    }
}
