//! The editor's MCP servers: ACP `McpServer` entries → kin's `ServerSpec`, an entry the SDK
//! cannot read → an error naming it (`unreadable_server`), and the notices of servers kin cannot
//! use → the user (`notice` session updates for clients that advertised
//! `clientCapabilities.session.notices`, else an agent message). MCP itself lives in `mcp/`.

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, McpServer, McpServerHttp, McpServerSse, McpServerStdio, Notice, NoticeSeverity,
    SessionUpdate, TextContent,
};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use super::unreadable::{params, shown};
use crate::mcp::{McpNotice, ServerSpec, Transport};
use crate::tools::capture::{Limits, ends_of};

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

/// The requests whose params hold the editor's `mcpServers`.
const WITH_SERVERS: [&str; 4] = ["session/new", "session/load", "session/resume", "session/fork"];

/// The answer to request `line` (of `method`) when one of its `mcpServers` entries is not one the
/// SDK reads: which entry (its place and name) and what is wrong with it, where the SDK would say
/// only "data did not match any variant of untagged enum McpServer". `None` for any other request,
/// or when every entry reads (params wrong in another way get the SDK's own answer, which names
/// the field).
pub(super) fn unreadable_server(method: &str, line: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Params {
        #[serde(rename = "mcpServers")]
        servers: Vec<Value>,
    }
    if !WITH_SERVERS.contains(&method) {
        return None;
    }
    let Params { servers } = params(line)?;
    let (at, server) = servers.iter().enumerate().find(|(_, s)| McpServer::deserialize(*s).is_err())?;
    let named = server
        .get("name")
        .filter(|name| name.is_string())
        .map(|name| format!(" ({})", shown(name)))
        .unwrap_or_default();
    Some(format!(
        "Invalid params: mcpServers[{at}]{named} {}. kin reads an MCP server as {{\"name\", \"command\", \"args\": [..], \
         \"env\": [{{\"name\", \"value\"}}]}} (stdio, without \"type\") or {{\"type\": \"http\" or \"sse\", \"name\", \
         \"url\", \"headers\": [{{\"name\", \"value\"}}]}}: fix the entry in the editor's MCP server settings, or remove it",
        server_defect(server)
    ))
}

/// What is wrong with an `mcpServers` entry the SDK cannot read, as the transport its `type`
/// names (none or `"stdio"`: stdio) reads it.
fn server_defect(server: &Value) -> String {
    fn read_as<'a, T: Deserialize<'a>>(server: &'a Value) -> String {
        match T::deserialize(server) {
            // serde's error may quote a value of the entry: its ends kept (what was expected
            // comes last).
            Err(e) => format!("cannot be read ({})", ends_of(&e.to_string(), SHOWN_ENDS).trim_end()),
            Ok(_) => "cannot be read".into(),
        }
    }
    if !server.is_object() {
        return format!("is not an object ({})", shown(server));
    }
    match server.get("type") {
        None => read_as::<McpServerStdio>(server),
        Some(kind @ Value::String(name)) => match name.as_str() {
            "stdio" => read_as::<McpServerStdio>(server),
            "http" => read_as::<McpServerHttp>(server),
            "sse" => read_as::<McpServerSse>(server),
            _ => format!("has the transport type {}, which kin does not know", shown(kind)),
        },
        Some(other) => format!("has a type that is not a string ({})", shown(other)),
    }
}

/// What an error quotes of a reader's error about an entry: its first and last bytes.
const SHOWN_ENDS: Limits = Limits { head: 120, tail: 80 };

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(method: &str, servers: Value) -> String {
        json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": {"cwd": "/ws", "mcpServers": servers}})
            .to_string()
    }

    #[test]
    fn an_entry_the_sdk_cannot_read_is_named_with_what_is_wrong() {
        let good = json!({"name": "fs", "command": "mcp-fs", "args": [], "env": []});
        let cases = [
            (
                json!({"type": "websocket", "name": "ws", "url": "ws://h"}),
                "mcpServers[1] (\"ws\") has the transport type \"websocket\", which kin does not know",
            ),
            (json!({"name": "bare"}), "mcpServers[1] (\"bare\") cannot be read (missing field `command`)"),
            (
                json!({"type": "stdio", "name": "typed"}),
                "mcpServers[1] (\"typed\") cannot be read (missing field `command`)",
            ),
            (json!({"type": "http", "name": "web"}), "mcpServers[1] (\"web\") cannot be read (missing field `url`)"),
            (
                json!({"type": "sse", "name": "s", "url": "http://h", "headers": {}}),
                "mcpServers[1] (\"s\") cannot be read (invalid type: map, expected a sequence)",
            ),
            (json!("fs"), "mcpServers[1] is not an object (\"fs\")"),
            (json!({"type": 5, "name": "five"}), "mcpServers[1] (\"five\") has a type that is not a string (5)"),
        ];
        let long = "n".repeat(10_000);
        let why = unreadable_server(
            "session/new",
            &request("session/new", json!([{"name": "a", "command": "c", "args": long}])),
        )
        .unwrap();
        assert!(
            why.contains("bytes omitted ...]\n")
                && why.contains("n\", expected a sequence). kin reads")
                && why.len() < 1_000,
            "{why}"
        );
        let why = unreadable_server("session/new", &request("session/new", json!([{"name": long}]))).unwrap();
        let cut = format!("mcpServers[0] (\"{}\n[... 9802 more bytes not shown ...]) cannot be read", "n".repeat(199));
        assert!(why.starts_with(&format!("Invalid params: {cut}")), "{why}");
        for method in WITH_SERVERS {
            for (bad, says) in &cases {
                let why = unreadable_server(method, &request(method, json!([good, bad])))
                    .unwrap_or_else(|| panic!("{method} {bad} is read"));
                assert!(why.starts_with(&format!("Invalid params: {says}. kin reads an MCP server as")), "{why}");
                assert!(why.ends_with("fix the entry in the editor's MCP server settings, or remove it"), "{why}");
            }
        }
    }

    #[test]
    fn readable_entries_and_other_requests_are_left_to_the_sdk() {
        let servers = json!([
            {"name": "fs", "command": "mcp-fs", "args": ["-v"], "env": [{"name": "A", "value": "1"}], "extra": true},
            {"type": "http", "name": "web", "url": "https://h/mcp", "headers": [{"name": "X", "value": "y"}]},
            {"type": "sse", "name": "events", "url": "https://h/sse", "headers": []},
        ]);
        assert_eq!(unreadable_server("session/new", &request("session/new", servers)), None);
        // Not a request that takes servers, or params wrong in another way: the SDK answers.
        let bad = json!([{"type": "websocket"}]);
        assert_eq!(unreadable_server("session/prompt", &request("session/prompt", bad.clone())), None);
        assert_eq!(
            unreadable_server("session/new", r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}"#),
            None
        );
        let not_a_list = json!({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"mcpServers": bad[0]}});
        assert_eq!(unreadable_server("session/new", &not_a_list.to_string()), None);
    }
}
