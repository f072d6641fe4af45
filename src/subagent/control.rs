//! The model-facing controls of continuable children: `send_message` (more work for a
//! background child), `report` (installed only in continuable children: content for the direct
//! parent) and `interrupt_agent` (an ancestor cancels a descendant's current turn).

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::ErrorCode;
use super::continuation::ContinuationManager;
use crate::tools::{Access, Caller, Tool, ToolContext, ToolError, ToolOutput};

fn caller(ctx: &ToolContext, tool: &str) -> Result<Arc<Caller>, ToolError> {
    ctx.caller.clone().ok_or_else(|| {
        ToolError::new("NO_CALLER", format!("{tool} requires a calling agent (exec.agent was undefined)"))
    })
}

fn string_arg(args: &Value, key: &str) -> Result<String, ToolError> {
    args[key]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| ToolError::new("INVALID_ARGUMENTS", format!("{key} must be a string")))
}

/// `string_arg`, refused when blank with `what_to_send` said (nothing is sent).
fn text_arg(args: &Value, key: &str, what_to_send: &str) -> Result<String, ToolError> {
    let text = string_arg(args, key)?;
    if text.trim().is_empty() {
        return Err(ToolError::new("INVALID_ARGUMENTS", format!("{key} is empty: {what_to_send} (nothing was sent)")));
    }
    Ok(text)
}

/// `send_message`.
pub struct SendMessageTool(pub Arc<ContinuationManager>);

impl Tool for SendMessageTool {
    fn name(&self) -> &str {
        "send_message"
    }

    fn access(&self, _arguments: &Value) -> Access {
        Access::Delegate
    }

    fn description(&self) -> String {
        "Send a message to a background subagent by its subagent id, continuing the same conversation. It becomes the subagent's next turn: if it is still working, the message waits until its current turn finishes, so it cannot redirect work already underway. This call returns no answer from the subagent — only confirmation that the message was delivered — so use it to give it more work. A failure means the message was NOT delivered.".into()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "subagent_id": {"type": "string", "description": "The subagent id returned when the background subagent was started."},
                "message": {"type": "string", "description": "The next task or information for the subagent."},
            },
            "required": ["subagent_id", "message"],
            "additionalProperties": false,
        })
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let manager = self.0.clone();
        async move {
            let parent = caller(&ctx, "send_message")?;
            let id = string_arg(&arguments, "subagent_id")?;
            let message = text_arg(&arguments, "message", "write what the subagent should do next")?;
            let source = json!({"kind": "coordinator", "senderSessionId": parent.header.id});
            let content = vec![json!({"type": "text", "text": message})];
            // The call's cancellation holds only until the message is handed to the child; from
            // then on the answer is what became of it (accepted means on disk).
            match manager.followup_unless(&parent, &id, content, source, &ctx.cancel).await {
                Ok(_) => Ok(ToolOutput::text(format!("message queued as the next turn for subagent {id}"))),
                Err(e) if e.code == ErrorCode::Cancelled => Err(ToolError::new("ABORTED", e.message)),
                Err(e) => Err(e.into()),
            }
        }
        .boxed()
    }
}

/// `report`, scoped to one continuable child.
pub struct ReportTool(pub Arc<ContinuationManager>);

impl Tool for ReportTool {
    fn name(&self) -> &str {
        "report"
    }

    fn access(&self, _arguments: &Value) -> Access {
        Access::Delegate
    }

    fn description(&self) -> String {
        "Report selected content to the agent that started you. Call this zero or more times for progress, findings, or a final answer. Reporting does not end your turn or finish your work, and only your direct parent receives it. A failed call may still have arrived, so do not blindly repeat it.".into()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "output": {"type": "string", "description": "Self-contained content for your parent; it does not see your private work."},
            },
            "required": ["output"],
            "additionalProperties": false,
        })
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let manager = self.0.clone();
        async move {
            let child = caller(&ctx, "report")?;
            let output = text_arg(&arguments, "output", "write what your parent should know")?;
            let message_id = manager.report(&child.header.id, &output).await?;
            Ok(ToolOutput::text(format!("report accepted by the agent that started you as message {message_id}")))
        }
        .boxed()
    }
}

/// `interrupt_agent`.
pub struct InterruptTool(pub Arc<ContinuationManager>);

impl Tool for InterruptTool {
    fn name(&self) -> &str {
        "interrupt_agent"
    }

    fn access(&self, _arguments: &Value) -> Access {
        Access::Delegate
    }

    fn description(&self) -> String {
        "Interrupt the current turn of a background subagent you started (or one of its descendants), by its id. Its queued messages stay queued (they run next) unless you set discard, which drops them for good; a later send_message continues the same conversation. Interrupting a subagent that has already finished does nothing.".into()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "agent_id": {"type": "string", "description": "The id of the subagent to interrupt."},
                "discard": {"type": "boolean", "description": "Also drop the messages queued for it, so they never run (default false)."},
            },
            "required": ["agent_id"],
            "additionalProperties": false,
        })
    }

    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let manager = self.0.clone();
        async move {
            let ancestor = caller(&ctx, "interrupt_agent")?;
            let id = string_arg(&arguments, "agent_id")?;
            let discard = match &arguments["discard"] {
                Value::Null => false,
                Value::Bool(discard) => *discard,
                _ => return Err(ToolError::new("INVALID_ARGUMENTS", "discard must be a boolean")),
            };
            let discarded = manager.interrupt(&ancestor.header.id, &id, discard).await?;
            Ok(ToolOutput::text(if discard {
                format!("interrupt requested for agent {id}; {discarded} queued messages discarded")
            } else {
                format!("interrupt requested for agent {id}")
            }))
        }
        .boxed()
    }
}
