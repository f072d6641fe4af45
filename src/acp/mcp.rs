//! The editor's MCP servers: ACP `McpServer` entries → kin's `ServerSpec`, and the notices of
//! servers kin cannot use → the user (`notice` session updates for clients that advertised
//! `clientCapabilities.session.notices`, else an agent message). MCP itself lives in `mcp/`.

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, McpServer, Notice, NoticeSeverity, SessionUpdate, TextContent,
};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::mcp::{McpNotice, ServerSpec, Transport};

/// The editor's servers as kin's specs; every entry is kept (one kin cannot use gets a notice).
pub(super) fn specs(servers: &[McpServer]) -> Vec<ServerSpec> {
    servers
        .iter()
        .map(|server| match server {
            McpServer::Stdio(s) => ServerSpec::from_editor(
                s.name.clone(),
                Transport::Stdio {
                    command: s.command.display().to_string(),
                    args: s.args.clone(),
                    env: s.env.iter().map(|v| (v.name.clone(), v.value.clone())).collect(),
                },
            ),
            McpServer::Http(h) => ServerSpec::from_editor(
                h.name.clone(),
                Transport::Http {
                    url: h.url.clone(),
                    headers: h.headers.iter().map(|v| (v.name.clone(), v.value.clone())).collect(),
                },
            ),
            McpServer::Sse(s) => ServerSpec::from_editor(s.name.clone(), Transport::Unsupported { kind: "sse".into() }),
            _ => ServerSpec::from_editor("unknown", Transport::Unsupported { kind: "unknown".into() }),
        })
        .collect()
}

/// Tells the user about each notice of a session's servers until the session's servers are
/// gone: as a `notice` update when the client takes them, else as an agent message.
pub(super) fn forward(
    cx: &ConnectionTo<Client>,
    session_id: String,
    mut notices: UnboundedReceiver<McpNotice>,
    as_notices: bool,
) {
    let connection = cx.clone();
    let spawned = cx.spawn(async move {
        while let Some(notice) = notices.recv().await {
            super::tree::notify(&connection, &session_id, notice_update(notice.title, notice.detail, as_notices));
        }
        Ok(())
    });
    if let Err(e) = spawned {
        tracing::debug!("cannot forward MCP notices: {e}");
    }
}

/// A warning for the user: a `notice` update for a client that shows them
/// (`clientCapabilities.session.notices`), else an agent message `<title>: <detail>`.
pub(super) fn notice_update(title: String, detail: String, as_notices: bool) -> SessionUpdate {
    if as_notices {
        SessionUpdate::Notice(Notice::new(NoticeSeverity::Warning, title).description(detail))
    } else {
        let text = format!("{title}: {detail}\n");
        SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(text))))
    }
}
