//! Keyless replay (`--replay DIR`, scenarios): no MCP server is started. A session's servers are
//! answered from the scenario's recorded session logs (`session*.jsonl` in DIR): a server offers
//! the tools the logs called under its prefix (`mcp__<server>__…`), and each call returns the
//! recorded result of the call with the same name and call id (in recorded order when an id
//! repeats). A call the logs do not hold fails with `MCP_NOT_RECORDED`.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use super::names;
use crate::session::Kind;
use crate::session::event::{ToolCall, ToolResult};
use crate::tools::{ToolError, ToolOutput};

/// The MCP calls and results of a scenario's recorded logs.
#[derive(Debug, Default)]
pub(crate) struct Recording {
    /// Every MCP tool name the logs called.
    names: BTreeSet<String>,
    /// (tool name, call id) → the recorded `tool/result`s, in log order.
    results: Mutex<HashMap<(String, String), VecDeque<ToolResult>>>,
}

impl Recording {
    /// Reads the `session*.jsonl` logs of a scenario directory (an unreadable log is skipped
    /// with a warning: the replay model reports it).
    pub(crate) fn from_dir(dir: &Path) -> Recording {
        let mut recording = Recording::default();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return recording;
        };
        let mut paths: Vec<_> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                name.starts_with("session") && name.ends_with(".jsonl")
            })
            .collect();
        paths.sort();
        let results = recording.results.get_mut().unwrap_or_else(PoisonError::into_inner);
        for path in paths {
            let scanned = match crate::session::scan::scan_file(&path) {
                Ok(scanned) => scanned,
                Err(e) => {
                    tracing::warn!(path = %path.display(), "replay: cannot read a recorded log for MCP results: {e}");
                    continue;
                }
            };
            let mut called: HashMap<String, String> = HashMap::new();
            for event in &scanned.events {
                if event.kind == Kind::ToolCall
                    && let Some(call) = event.get::<ToolCall>()
                    && names::is_mcp_tool(&call.name)
                {
                    recording.names.insert(call.name.clone());
                    called.insert(call.call_id, call.name);
                } else if event.kind == Kind::ToolResult
                    && let Some(result) = event.get::<ToolResult>()
                {
                    let id = result.message.source.call_id.clone();
                    if let Some(name) = called.remove(&id) {
                        results.entry((name, id)).or_default().push_back(result);
                    }
                }
            }
        }
        recording
    }

    /// The recorded tool names of `server`.
    pub(super) fn tools_for(&self, server: &str) -> Vec<String> {
        let prefix = names::prefix_for(server);
        self.names.iter().filter(|n| n.starts_with(&prefix)).cloned().collect()
    }

    /// The recorded result of call `call_id` of tool `name`.
    pub(super) fn answer(&self, name: &str, call_id: &str) -> Result<ToolOutput, ToolError> {
        let recorded = self
            .results
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&(name.to_string(), call_id.to_string()))
            .and_then(VecDeque::pop_front);
        let Some(result) = recorded else {
            return Err(ToolError::named(
                "McpError",
                "MCP_NOT_RECORDED",
                format!("replay: the recorded logs hold no result for {name} call {call_id}"),
            ));
        };
        let part = result.message.content.into_iter().next();
        let is_error = part.as_ref().is_some_and(|p| p.is_error);
        let content = part.map(|p| p.content).unwrap_or_default();
        if is_error {
            let text = content.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("");
            let message = text.strip_prefix("Error: ").unwrap_or(&text).to_string();
            let error =
                result.error.unwrap_or(crate::session::event::ToolFailure { name: String::new(), code: String::new() });
            let or = |value: String, default: &str| if value.is_empty() { default.to_string() } else { value };
            return Err(ToolError::named(&or(error.name, "McpError"), &or(error.code, "MCP_ERROR"), message));
        }
        Ok(ToolOutput { content, events: Vec::new(), meta: result.meta })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn recorded_results_answer_by_name_and_call_id() {
        let dir = tempfile::tempdir().unwrap();
        let lines = [
            r#"{"type":"session","version":0,"id":"s","createdAt":0,"delegationDepth":0}"#,
            r#"{"type":"tool/call","seq":0,"time":0,"data":{"turn":1,"step":1,"callId":"c1","name":"mcp__fx__echo","arguments":"{}"}}"#,
            r#"{"type":"tool/call","seq":1,"time":0,"data":{"turn":1,"step":1,"callId":"c2","name":"mcp__fx__fail","arguments":"{}"}}"#,
            r#"{"type":"tool/call","seq":2,"time":0,"data":{"turn":1,"step":1,"callId":"c3","name":"read","arguments":"{}"}}"#,
            r#"{"type":"tool/result","seq":3,"time":0,"data":{"turn":1,"step":1,"message":{"source":{"kind":"tool","callId":"c1"},"content":[{"type":"tool-result","toolCallId":"c1","content":[{"type":"text","text":"hi"}],"isError":false}],"role":"user","id":"x"},"meta":{"mcp":{"server":"fx","tool":"echo"}}},"sourceEventSeqs":[0],"surfaceOp":"append"}"#,
            r#"{"type":"tool/result","seq":4,"time":0,"data":{"turn":1,"step":1,"message":{"source":{"kind":"tool","callId":"c2"},"content":[{"type":"tool-result","toolCallId":"c2","content":[{"type":"text","text":"Error: boom"}],"isError":true}],"role":"user","id":"y"},"error":{"name":"McpToolError","code":"MCP_TOOL_ERROR"}},"sourceEventSeqs":[1],"surfaceOp":"append"}"#,
        ];
        std::fs::write(dir.path().join("session.jsonl"), lines.join("\n") + "\n").unwrap();
        let recording = Recording::from_dir(dir.path());
        assert_eq!(recording.tools_for("fx"), ["mcp__fx__echo", "mcp__fx__fail"]);
        assert!(recording.tools_for("other").is_empty());
        let ok = recording.answer("mcp__fx__echo", "c1").unwrap();
        assert_eq!(ok.content, [json!({"type": "text", "text": "hi"})]);
        assert_eq!(ok.meta, Some(json!({"mcp": {"server": "fx", "tool": "echo"}})));
        let err = recording.answer("mcp__fx__fail", "c2").unwrap_err();
        assert_eq!(
            (err.name.as_str(), err.code.as_str(), err.message.as_str()),
            ("McpToolError", "MCP_TOOL_ERROR", "boom")
        );
        let missing = recording.answer("mcp__fx__echo", "c1").unwrap_err();
        assert_eq!(missing.code, "MCP_NOT_RECORDED");
    }
}
