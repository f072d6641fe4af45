//! `list_agents` (dsh `tool-subagent-list-agents`, seed era, dsh-design.md §1.8): the model-facing
//! projection of the catalog. It lists the calling agent's continuable children (one-shot children
//! are dropped, diagnostics kept) in trace order, `running` when the child's session is live in
//! this process and `complete` when it only exists in storage.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::catalog::{Activity, ListEntry, Mode, list_children};
use super::error::ErrorCode;
use crate::session::query::QueryService;
use crate::tools::{Access, Tool, ToolContext, ToolError, ToolOutput};

/// The tool description (seed era), verbatim.
pub const DESCRIPTION: &str = "List your continuable background subagents by durable id and label. Status is a snapshot of the stored record: running means the subagent session is currently live in this process, complete means it exists only in storage and a `send_message` starts a new turn on the same conversation. The snapshot is not a delivery promise — `send_message` performs the authoritative check and may still fail. Children that could not be read are reported as diagnostics instead of being silently dropped.";

/// What an empty projection renders as.
pub(crate) const NO_SUBAGENTS: &str = "(no subagents)";

/// `list_agents`, over the session query (`None`: the deployment has none, and every call fails
/// with `SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE`).
pub struct ListAgentsTool(pub Option<Arc<dyn QueryService>>);

/// The model-visible text of a listing: continuable children as `<id> [running|complete] —
/// <label>` (`<agent>: <label>` for a child started as a named agent), then ` (N queued)` and
/// ` (N queued messages discarded, never run)` when its inbox says so, diagnostics as `<id> [diagnostic: <reason>]`, one per line in listing order;
/// one-shot children are dropped; nothing left is `(no subagents)`.
pub fn render(entries: &[ListEntry]) -> String {
    let lines: Vec<String> = entries
        .iter()
        .filter_map(|entry| match entry {
            ListEntry::Child { mode: Mode::OneShot, .. } => None,
            ListEntry::Child { id, label, agent, activity, inbox, .. } => {
                let status = match activity {
                    Activity::Running => "running",
                    Activity::Inactive => "complete",
                };
                let title = super::child_title(agent.as_deref(), label.as_deref()).unwrap_or_default();
                let mut line = format!("{id} [{status}] \u{2014} {title}");
                if inbox.pending > 0 {
                    line.push_str(&format!(" ({} queued)", inbox.pending));
                }
                if inbox.discarded > 0 {
                    line.push_str(&format!(" ({} queued messages discarded, never run)", inbox.discarded));
                }
                Some(line)
            }
            ListEntry::Diagnostic { id, reason } => Some(format!("{id} [diagnostic: {}]", reason.as_str())),
        })
        .collect();
    if lines.is_empty() { NO_SUBAGENTS.to_string() } else { lines.join("\n") }
}

impl Tool for ListAgentsTool {
    fn name(&self) -> &str {
        "list_agents"
    }

    fn access(&self, _arguments: &Value) -> Access {
        Access::Delegate
    }

    fn description(&self) -> String {
        DESCRIPTION.into()
    }

    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn execute(&self, _arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let query = self.0.clone();
        async move {
            let parent = ctx.caller.clone().ok_or_else(|| {
                ToolError::new("NO_CALLER", "list_agents requires a calling agent (exec.agent was undefined)")
            })?;
            let parent_id = parent.header.id.clone();
            // The caller's cancellation token is the listing's signal. The reads are blocking file
            // I/O, so they run off the async workers.
            let cancel = ctx.cancel.clone();
            let listing = tokio::task::spawn_blocking(move || list_children(query.as_deref(), &parent_id, &cancel))
                .await
                .map_err(|e| {
                    ToolError::new(ErrorCode::Infrastructure.code(), format!("subagent listing failed: {e}"))
                })?;
            let entries = listing?;
            Ok(ToolOutput::text(render(&entries)))
        }
        .boxed()
    }
}
