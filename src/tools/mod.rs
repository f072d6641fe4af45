//! The tool seam: `trait Tool` (name, description, JSON schema, parallel-safe flag, async execute
//! with cancellation) and the registry the agent loop dispatches through. Errors reach the model
//! as `Error: <message>` with `isError: true`; an unknown name is an error result, not a crash.

pub mod bash;
pub mod builtin;
pub mod files;
pub mod fs;
pub mod paths;
pub mod search;
pub mod todo;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::model::{ModelRoute, ToolSchema};
use crate::session::{Event, SessionHeader};

/// How long a cancelled tool call may take to wind down (kill processes, cancel children)
/// before its future is dropped.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The agent making a tool call.
#[derive(Debug, Clone)]
pub struct Caller {
    pub header: SessionHeader,
    /// Effective delegation depth: max(header depth, runtime depth).
    pub depth: u64,
    pub route: ModelRoute,
    /// The caller's events through its last `turn/end` (present when a tool asked for history).
    pub history: Option<Arc<Vec<Event>>>,
}

/// What a tool call runs with.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub session_id: String,
    pub cwd: Option<PathBuf>,
    pub call_id: String,
    pub cancel: CancellationToken,
    /// The calling agent; `None` outside an agent (tests, direct calls).
    pub caller: Option<Arc<Caller>>,
    /// Set by the permission gate when it let this call touch a path outside the workspace; the
    /// file and search tools then skip their own workspace check.
    pub allow_outside: bool,
    /// Where the file tools read and write text (the editor, over ACP); `None`: the disk.
    pub file_access: Option<Arc<dyn files::FileAccess>>,
    /// Where the call reports what it is doing while it runs; `None` outside an agent.
    pub progress: Option<Progress>,
}

/// A running call's progress reports: the agent records each as a log-only `tool/progress`
/// event (in order, before the call's result), and the editor shows it on the call.
#[derive(Debug, Clone)]
pub struct Progress {
    call_id: String,
    tx: tokio::sync::mpsc::UnboundedSender<(String, String)>,
}

impl Progress {
    /// A sink for `call_id` whose reports arrive on `tx` as `(call id, text)`.
    pub fn new(call_id: &str, tx: tokio::sync::mpsc::UnboundedSender<(String, String)>) -> Self {
        Progress { call_id: call_id.to_string(), tx }
    }

    /// Reports what the call is doing now (dropped once the call's batch has ended).
    pub fn report(&self, text: impl Into<String>) {
        let _ = self.tx.send((self.call_id.clone(), text.into()));
    }
}

impl ToolContext {
    /// A context without a calling agent.
    pub fn detached(cwd: Option<PathBuf>, cancel: CancellationToken) -> Self {
        ToolContext {
            session_id: String::new(),
            cwd,
            call_id: String::new(),
            cancel,
            caller: None,
            allow_outside: false,
            file_access: None,
            progress: None,
        }
    }
}

/// A tool's answer: content blocks for the model, plus log-only events the agent records
/// just before the result (e.g. `todo/write`), plus `meta` for the editor (recorded as the
/// result's `data.meta`, e.g. `{"diff": {path, oldText, newText}}` of write and edit).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub content: Vec<Value>,
    pub events: Vec<(String, Value)>,
    pub meta: Option<Value>,
}

impl ToolOutput {
    pub fn text(text: impl Into<String>) -> Self {
        ToolOutput { content: vec![json!({"type": "text", "text": text.into()})], events: Vec::new(), meta: None }
    }

    /// Sets the result's `meta` (never shown to the model).
    pub fn with_meta(mut self, meta: Value) -> Self {
        self.meta = Some(meta);
        self
    }

    /// Adds a log-only event recorded with the result.
    pub fn with_event(mut self, kind: &str, data: Value) -> Self {
        self.events.push((kind.to_string(), data));
        self
    }
}

/// A failed tool call: the message the model reads, plus a name and stable code for the log.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolError {
    pub name: String,
    pub code: String,
    pub message: String,
    /// Log-only events recorded with the failed result (as `ToolOutput::events`).
    pub events: Vec<(String, Value)>,
}

impl ToolError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self::named("ToolError", code, message)
    }

    /// An error with its own name (`AbortError`, `PermissionError`, ...).
    pub fn named(name: &str, code: &str, message: impl Into<String>) -> Self {
        ToolError { name: name.into(), code: code.into(), message: message.into(), events: Vec::new() }
    }

    /// Adds a log-only event recorded with the failed result.
    pub fn with_event(mut self, kind: &str, data: Value) -> Self {
        self.events.push((kind.to_string(), data));
        self
    }
}

/// What a call does, in a few words: the title editors show for it, and a child's progress.
pub fn call_title(name: &str, args: &Value) -> String {
    let arg = |k: &str| args[k].as_str().unwrap_or_default().to_string();
    match name {
        "subagent" | "subagent_fork" => arg("description"),
        "read" => format!("Read {}", arg("file_path")),
        "write" => format!("Write {}", arg("file_path")),
        "edit" => format!("Edit {}", arg("file_path")),
        // What runs, not the model's description of it: the dialog shows the same title.
        "bash" => format!("Run `{}`", crate::permission::shorten(&arg("command"), 200)),
        "glob" | "grep" => match args["path"].as_str() {
            Some(path) => format!("{name} {} in {path}", arg("pattern")),
            None => format!("{name} {}", arg("pattern")),
        },
        "todo_write" => "Update plan".into(),
        // A delegation to an external agent (`delegate_NAME`) says what it delegates.
        other => match args["description"].as_str().filter(|d| !d.trim().is_empty()) {
            Some(description) => format!("{other}: {description}"),
            None => other.to_string(),
        },
    }
}

/// A capability the model can call.
pub trait Tool: Send + Sync {
    fn name(&self) -> &str;
    fn description(&self) -> String;
    /// JSON Schema of the arguments object.
    fn parameters(&self) -> Value;
    /// True when calls may run concurrently with other parallel-safe calls of the same step.
    fn parallel_safe(&self) -> bool {
        false
    }
    /// True when the tool needs the caller's completed history (`Caller::history`).
    fn needs_history(&self) -> bool {
        false
    }
    fn execute(&self, arguments: Value, ctx: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>>;
}

/// The tools of one agent, by name (sorted, so the model sees a stable list).
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.name().to_string(), tool);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    pub fn schemas(&self) -> Vec<ToolSchema> {
        self.tools
            .values()
            .map(|t| ToolSchema {
                name: t.name().to_string(),
                description: t.description(),
                parameters: t.parameters(),
            })
            .collect()
    }

    /// A copy holding only the tools `keep` accepts.
    pub fn filtered(&self, keep: impl Fn(&str) -> bool) -> ToolRegistry {
        let tools = self.tools.iter().filter(|(name, _)| keep(name)).map(|(n, t)| (n.clone(), t.clone())).collect();
        ToolRegistry { tools }
    }

    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// True when `name` is known and parallel-safe.
    pub fn is_parallel_safe(&self, name: &str) -> bool {
        self.get(name).is_some_and(|t| t.parallel_safe())
    }

    /// Runs one call; every failure becomes a `ToolError` (unknown tool, bad JSON, the tool's own).
    pub async fn call(&self, name: &str, raw_arguments: &str, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let Some(tool) = self.get(name).cloned() else {
            return Err(ToolError::new("UNKNOWN_TOOL", format!("unknown tool \"{name}\"")));
        };
        let arguments: Value = if raw_arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(raw_arguments).map_err(|e| {
                ToolError::new("INVALID_ARGUMENTS", format!("arguments for {name} are not valid JSON: {e}"))
            })?
        };
        let cancel = ctx.cancel.clone();
        let run = tool.execute(arguments, ctx);
        tokio::pin!(run);
        tokio::select! {
            result = &mut run => result,
            () = cancel.cancelled() => {
                // Let the tool wind down (it sees the same token) and report what really
                // happened; a tool that does not finish within the grace is abandoned.
                match tokio::time::timeout(CANCEL_GRACE, &mut run).await {
                    Ok(result) => result,
                    Err(_) => Err(builtin::aborted()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_say_what_a_call_does() {
        let title = |name: &str, args: Value| call_title(name, &args);
        assert_eq!(title("subagent", json!({"description": "scan the repo"})), "scan the repo");
        assert_eq!(title("delegate_codex", json!({"description": "review", "prompt": "…"})), "delegate_codex: review");
        assert_eq!(title("delegate_codex", json!({"description": " "})), "delegate_codex");
        assert_eq!(title("list_agents", json!({})), "list_agents");
        assert_eq!(title("write", json!({"file_path": "a.md"})), "Write a.md");
    }
}
