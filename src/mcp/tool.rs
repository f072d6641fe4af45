//! An MCP tool as a kin `Tool`: the model-visible name, the server's description and (normalised)
//! input schema, what a call touches (`External`: kin cannot see into it), and a call that goes
//! to the server (or, in replay, to the recording).

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use super::replay::Recording;
use super::server::Server;
use crate::tools::{Access, Tool, ToolContext, ToolError, ToolOutput};

/// Where a call goes.
pub(super) enum Backend {
    /// The live server and the tool's own name there.
    Live { server: Arc<Server>, tool: String },
    /// Keyless replay: the recorded result.
    Recorded(Arc<Recording>),
}

pub(super) struct McpTool {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    /// Whether a trusted server (config `trust = "read-only-hints"`) annotated the tool
    /// `readOnlyHint: true`.
    pub trusted_read_only: bool,
    pub backend: Backend,
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    fn parameters(&self) -> Value {
        self.parameters.clone()
    }

    /// What kin cannot see into, asked about like a command; a read in the workspace when a
    /// trusted server says the tool only reads.
    fn access(&self, _arguments: &Value) -> Access {
        if self.trusted_read_only { Access::Read { paths: Vec::new(), line: None } } else { Access::External }
    }

    /// Under the server's identity (its name, transport, command and arguments or URL) and the
    /// tool's own name there: two servers whose names map to one model-visible name, or another
    /// program under a server's name after a resume, never inherit each other's answers.
    fn remembered_as(&self, _arguments: &Value) -> Option<String> {
        Some(match &self.backend {
            Backend::Live { server, tool } => format!("mcp\u{0}{}\u{0}{tool}", server.spec.identity()),
            Backend::Recorded(_) => self.name.clone(),
        })
    }

    /// `server: tool {arguments}` (the editor, the permission dialog and a parent's progress).
    fn title(&self, arguments: &Value) -> String {
        super::names::call_title(&self.name, arguments).unwrap_or_else(|| self.name.clone())
    }

    /// Arguments that are not a JSON object are refused before the gate asks about the call.
    fn check(&self, arguments: &Value) -> Result<(), ToolError> {
        match &self.backend {
            Backend::Live { tool, .. } => super::server::check_arguments(tool, arguments),
            Backend::Recorded(_) => Ok(()),
        }
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        match &self.backend {
            Backend::Live { server, tool } => {
                let (server, tool) = (server.clone(), tool.clone());
                async move { server.call(&tool, arguments, ctx.cancel.clone()).await }.boxed()
            }
            Backend::Recorded(recording) => {
                let answer = recording.answer(&self.name, &ctx.call_id);
                async move { answer }.boxed()
            }
        }
    }
}
