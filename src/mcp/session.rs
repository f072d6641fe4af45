//! Every MCP server of one top-level session (its children use the same ones): started
//! concurrently when the session is created or loaded, offered as tools at each step, closed
//! with the session. The first step waits for the starts to finish (each bounded by its startup
//! timeout; cancelling the turn stops the wait); later steps pick up tool-list changes and
//! restarted servers. What goes wrong reaches the user as an [`McpNotice`], never as a failed
//! session.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use serde_json::json;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_util::sync::CancellationToken;

use super::replay::Recording;
use super::server::Server;
use super::spec::{Defaults, ServerSpec, Transport};
use super::tool::{Backend, McpTool};
use super::{names, schema};
use crate::session::event::McpServers;
use crate::tools::{Tool, ToolSource};

/// The most servers one session starts (the rest are skipped with a notice).
const MAX_SERVERS: usize = 64;

/// Something the user should know about a server (it failed to start, stopped, was skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpNotice {
    pub server: String,
    /// One line that stands alone: "MCP server `x` failed to start".
    pub title: String,
    /// Why, and the server's last stderr lines.
    pub detail: String,
}

impl McpNotice {
    pub(super) fn new(server: &str, title: String, reason: &str, stderr: &[String]) -> Self {
        let mut detail = format!("{}{}", capitalised(reason), if reason.ends_with('.') { "" } else { "." });
        if !stderr.is_empty() {
            detail.push_str("\nLast stderr lines:\n");
            detail.push_str(&stderr.join("\n"));
        }
        McpNotice { server: server.to_string(), title, detail }
    }
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// One set of servers (replaced as a whole when a resume names other servers).
struct Inner {
    specs: Vec<ServerSpec>,
    servers: Vec<Arc<Server>>,
    recording: Option<Arc<Recording>>,
}

/// The MCP servers of one session.
pub(crate) struct McpSession {
    inner: Mutex<Arc<Inner>>,
    cwd: Option<PathBuf>,
    defaults: Defaults,
    recording: Option<Arc<Recording>>,
    notice_tx: UnboundedSender<McpNotice>,
    notice_rx: Mutex<Option<UnboundedReceiver<McpNotice>>>,
}

impl McpSession {
    /// Starts `specs` in the background (none in replay, where `recording` answers).
    pub(crate) fn start(
        specs: Vec<ServerSpec>,
        cwd: Option<PathBuf>,
        defaults: Defaults,
        recording: Option<Arc<Recording>>,
    ) -> Arc<McpSession> {
        let (notice_tx, notice_rx) = unbounded_channel();
        let session = McpSession {
            inner: Mutex::new(Arc::new(Inner { specs: Vec::new(), servers: Vec::new(), recording: None })),
            cwd,
            defaults,
            recording,
            notice_tx,
            notice_rx: Mutex::new(Some(notice_rx)),
        };
        *session.lock() = Arc::new(session.launch(specs));
        Arc::new(session)
    }

    fn lock(&self) -> MutexGuard<'_, Arc<Inner>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn launch(&self, mut specs: Vec<ServerSpec>) -> Inner {
        if specs.len() > MAX_SERVERS {
            let skipped: Vec<String> = specs.drain(MAX_SERVERS..).map(|s| s.name).collect();
            let title = format!("{} MCP servers were skipped", skipped.len());
            let reason =
                format!("kin starts at most {MAX_SERVERS} servers per session; skipped: {}", skipped.join(", "));
            tracing::warn!("{title}: {reason}");
            let _ = self.notice_tx.send(McpNotice::new(&skipped[0], title, &reason, &[]));
        }
        if let Some(recording) = &self.recording {
            return Inner { specs, servers: Vec::new(), recording: Some(recording.clone()) };
        }
        let servers: Vec<Arc<Server>> = specs
            .iter()
            .map(|spec| {
                let startup = spec.settings.startup_timeout.unwrap_or(self.defaults.startup_timeout);
                let tool = spec.settings.tool_timeout.unwrap_or(self.defaults.tool_timeout);
                Server::new(spec.clone(), self.cwd.clone(), startup, tool, self.notice_tx.clone())
            })
            .collect();
        for server in &servers {
            match &server.spec.transport {
                Transport::Unsupported { kind } => {
                    let reason =
                        format!("the `{kind}` transport is not supported (kin connects to stdio and http servers)");
                    let title = format!("MCP server `{}` was skipped", server.name());
                    tracing::warn!(server = %server.name(), "{title}: {reason}");
                    let _ = self.notice_tx.send(McpNotice::new(server.name(), title, &reason, &[]));
                    server.fail_unstarted();
                }
                Transport::Stdio { .. } | Transport::Http { .. } => server.start(),
            }
        }
        Inner { specs, servers, recording: None }
    }

    /// The servers the session has now.
    pub(crate) fn specs(&self) -> Vec<ServerSpec> {
        self.lock().specs.clone()
    }

    /// The notices, for whoever tells the user (once; later calls get `None`).
    pub(crate) fn take_notices(&self) -> Option<UnboundedReceiver<McpNotice>> {
        self.notice_rx.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Closes the current servers and starts `specs` instead (a resume that names other servers).
    pub(crate) async fn replace(&self, specs: Vec<ServerSpec>) {
        let next = Arc::new(self.launch(specs));
        let old = std::mem::replace(&mut *self.lock(), next);
        join_all(old.servers.iter().map(|s| s.close())).await;
    }

    /// Closes every server (each gets a grace, then its process group is killed).
    pub(crate) async fn close(&self) {
        let old = std::mem::replace(
            &mut *self.lock(),
            Arc::new(Inner { specs: Vec::new(), servers: Vec::new(), recording: None }),
        );
        join_all(old.servers.iter().map(|s| s.close())).await;
    }

    /// The log's `mcp/servers` data for `specs`.
    pub(crate) fn describe(specs: &[ServerSpec]) -> McpServers {
        McpServers { servers: specs.iter().map(ServerSpec::describe).collect() }
    }
}

/// How long a step waits for servers still starting before a notice says it does.
const STARTING_NOTICE_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

impl ToolSource for McpSession {
    fn tools(&self, cancel: CancellationToken) -> BoxFuture<'static, Vec<Arc<dyn Tool>>> {
        let inner = self.lock().clone();
        let notices = self.notice_tx.clone();
        async move {
            if let Some(recording) = &inner.recording {
                return recorded_tools(&inner.specs, recording);
            }
            let ready = async {
                join_all(inner.servers.iter().map(|s| s.settled())).await;
                join_all(inner.servers.iter().map(|s| s.refresh())).await;
            };
            // The editor would show a silent spinner for up to a server's startup timeout.
            let still_starting = async {
                tokio::time::sleep(STARTING_NOTICE_AFTER).await;
                let waiting: Vec<&Arc<Server>> = inner.servers.iter().filter(|s| s.is_starting()).collect();
                if let Some(first) = waiting.first() {
                    let names: Vec<String> = waiting.iter().map(|s| format!("`{}`", s.name())).collect();
                    let title = format!("Waiting for MCP servers to start: {}", names.join(", "));
                    let reason = "the turn goes on once each has started and listed its tools, or its \
                                  startup_timeout_secs has passed";
                    let _ = notices.send(McpNotice::new(first.name(), title, reason, &[]));
                }
                std::future::pending::<()>().await
            };
            tokio::select! {
                () = ready => {}
                () = cancel.cancelled() => {}
                () = still_starting => {}
            }
            live_tools(&inner.servers)
        }
        .boxed()
    }
}

/// The tools of the ready servers, named.
fn live_tools(servers: &[Arc<Server>]) -> Vec<Arc<dyn Tool>> {
    let listed: Vec<(Arc<Server>, super::server::Listed)> =
        servers.iter().flat_map(|s| s.tools().into_iter().map(move |t| (s.clone(), t))).collect();
    let pairs: Vec<(&str, &str)> = listed.iter().map(|(s, t)| (s.name(), t.name.as_str())).collect();
    let assigned = names::assign(&pairs, &Default::default());
    listed
        .iter()
        .zip(assigned)
        .filter_map(|((server, tool), name)| {
            let (parameters, note) = schema::normalise(&tool.input_schema);
            let description = schema::description(tool.description.as_deref(), tool.title.as_deref(), note.as_deref());
            Some(Arc::new(McpTool {
                name: name?,
                description,
                parameters,
                trusted_read_only: tool.read_only_hint && server.trusts_hints(),
                backend: Backend::Live { server: server.clone(), tool: tool.name.clone() },
            }) as Arc<dyn Tool>)
        })
        .collect()
}

/// Replay: every recorded tool of each server, answered from the recording.
fn recorded_tools(specs: &[ServerSpec], recording: &Arc<Recording>) -> Vec<Arc<dyn Tool>> {
    specs
        .iter()
        .flat_map(|spec| {
            recording.tools_for(&spec.name).into_iter().map(|name| {
                Arc::new(McpTool {
                    name,
                    description: "A recorded MCP tool (replay).".into(),
                    parameters: json!({"type": "object", "properties": {}, "additionalProperties": true}),
                    trusted_read_only: false,
                    backend: Backend::Recorded(recording.clone()),
                }) as Arc<dyn Tool>
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_say_why_and_quote_stderr() {
        let notice =
            McpNotice::new("gh", "MCP server `gh` failed to start".into(), "the command `x` was not found", &[]);
        assert_eq!(notice.detail, "The command `x` was not found.");
        let notice = McpNotice::new("gh", "t".into(), "it exited", &["boom".into(), "bye".into()]);
        assert_eq!(notice.detail, "It exited.\nLast stderr lines:\nboom\nbye");
    }
}
