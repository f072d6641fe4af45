//! The editor's terminals, for a client that advertised `clientCapabilities.terminal`: kin's
//! `tools::terminal::Terminals` over `terminal/create`, `terminal/wait_for_exit`,
//! `terminal/output`, `terminal/kill` and `terminal/release`. Once a terminal exists, the call
//! shows it: a `tool_call_update` whose content is the terminal (after the call's note, if any),
//! sent before the command can end, so the editor embeds it live. Like every request kin makes of
//! the client, these are sent from the tool call's task and awaited with `block_task`.

use std::fmt;
use std::io;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, CreateTerminalRequest, KillTerminalRequest, ReleaseTerminalRequest, SessionUpdate, Terminal,
    TerminalOutputRequest, TextContent, ToolCallContent, ToolCallUpdate, ToolCallUpdateFields,
    WaitForTerminalExitRequest,
};
use futures::FutureExt;
use futures::future::BoxFuture;

use crate::tools::terminal::{TerminalCommand, TerminalExit, TerminalText, Terminals};

/// The terminals of the client on `cx`.
pub(crate) struct EditorTerminals {
    pub(crate) cx: ConnectionTo<Client>,
}

impl fmt::Debug for EditorTerminals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EditorTerminals").finish_non_exhaustive()
    }
}

fn failed(what: &str, e: impl fmt::Display) -> io::Error {
    io::Error::other(format!("{what} failed: {e}"))
}

/// The update that embeds terminal `id` in `call_id`'s content, after `note`.
fn embedding(call_id: &str, id: &str, note: Option<&str>) -> SessionUpdate {
    let mut content: Vec<ToolCallContent> =
        note.map(|n| ToolCallContent::from(ContentBlock::Text(TextContent::new(n)))).into_iter().collect();
    content.push(ToolCallContent::Terminal(Terminal::new(id.to_string())));
    let fields = ToolCallUpdateFields::new().content(content);
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(call_id.to_string(), fields))
}

impl Terminals for EditorTerminals {
    fn create(&self, command: TerminalCommand) -> BoxFuture<'static, io::Result<String>> {
        let cx = self.cx.clone();
        let TerminalCommand { session_id, call_id, program, args, cwd, output_limit, note } = command;
        let request = CreateTerminalRequest::new(session_id.clone(), program.display().to_string())
            .args(args)
            .cwd(cwd)
            .output_byte_limit(output_limit);
        async move {
            let response = cx.send_request(request).block_task().await.map_err(|e| failed("terminal/create", e))?;
            let id = response.terminal_id.0.to_string();
            super::tree::notify(&cx, &session_id, embedding(&call_id, &id, note.as_deref()));
            Ok(id)
        }
        .boxed()
    }

    fn wait(&self, session_id: &str, terminal: &str) -> BoxFuture<'static, io::Result<TerminalExit>> {
        let cx = self.cx.clone();
        let request = WaitForTerminalExitRequest::new(session_id.to_string(), terminal.to_string());
        async move {
            let response =
                cx.send_request(request).block_task().await.map_err(|e| failed("terminal/wait_for_exit", e))?;
            let status = response.exit_status;
            Ok(TerminalExit { code: status.exit_code, signal: status.signal })
        }
        .boxed()
    }

    fn output(&self, session_id: &str, terminal: &str) -> BoxFuture<'static, io::Result<TerminalText>> {
        let cx = self.cx.clone();
        let request = TerminalOutputRequest::new(session_id.to_string(), terminal.to_string());
        async move {
            let response = cx.send_request(request).block_task().await.map_err(|e| failed("terminal/output", e))?;
            Ok(TerminalText { output: response.output, truncated: response.truncated })
        }
        .boxed()
    }

    fn kill(&self, session_id: &str, terminal: &str) -> BoxFuture<'static, io::Result<()>> {
        let cx = self.cx.clone();
        let request = KillTerminalRequest::new(session_id.to_string(), terminal.to_string());
        async move { cx.send_request(request).block_task().await.map(drop).map_err(|e| failed("terminal/kill", e)) }
            .boxed()
    }

    fn release(&self, session_id: &str, terminal: &str) -> BoxFuture<'static, io::Result<()>> {
        let cx = self.cx.clone();
        let request = ReleaseTerminalRequest::new(session_id.to_string(), terminal.to_string());
        async move { cx.send_request(request).block_task().await.map(drop).map_err(|e| failed("terminal/release", e)) }
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedding_shows_the_note_then_the_terminal() {
        let wire = serde_json::to_value(embedding("c1", "term-1", Some("not sandboxed: x"))).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({
                "sessionUpdate": "tool_call_update",
                "toolCallId": "c1",
                "content": [
                    {"type": "content", "content": {"type": "text", "text": "not sandboxed: x"}},
                    {"type": "terminal", "terminalId": "term-1"}
                ]
            })
        );
    }
}
