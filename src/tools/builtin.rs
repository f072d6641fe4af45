//! The built-in coding tools (`read`, `write`, `edit`, `glob`, `grep`, `bash`, `todo_write`):
//! one call registers them all. Also the small helpers they share: reading arguments out of the
//! JSON object with clear errors, the call's working directory, and running blocking IO off the
//! async threads.

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use super::bash::BashTool;
use super::fs::{EditTool, FileState, ReadTool, WriteTool};
use super::search::{GlobTool, GrepTool};
use super::todo::TodoWriteTool;
use super::{ToolContext, ToolError, ToolRegistry};

/// Registers every coding tool; the file tools share `files` (what this session has read). The
/// order is the order of their advice in the system prompt: find and read first, then change,
/// then run.
pub fn register_coding_tools(registry: &mut ToolRegistry, files: FileState) {
    registry.register(Arc::new(ReadTool::new(files.clone())));
    registry.register(Arc::new(GlobTool));
    registry.register(Arc::new(GrepTool));
    registry.register(Arc::new(EditTool::new(files.clone())));
    registry.register(Arc::new(WriteTool::new(files)));
    registry.register(Arc::new(BashTool::default()));
    registry.register(Arc::new(TodoWriteTool));
}

/// The directory relative paths of a call resolve against (empty when the session has none,
/// which means the process directory).
pub(crate) fn call_cwd(ctx: &ToolContext) -> PathBuf {
    ctx.cwd.clone().unwrap_or_default()
}

/// The error of a call stopped by its cancellation token (the registry's own wording).
pub(crate) fn aborted() -> ToolError {
    ToolError::named("AbortError", "ABORTED", "tool call aborted")
}

/// An `INVALID_ARGUMENTS` error for `tool`.
pub(crate) fn invalid_args(tool: &str, message: impl Display) -> ToolError {
    ToolError::new("INVALID_ARGUMENTS", format!("{tool}: {message}"))
}

/// A required string argument.
pub(crate) fn required_str(args: &Value, key: &str, tool: &str) -> Result<String, ToolError> {
    match args.get(key) {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(other) => Err(invalid_args(tool, format!("`{key}` must be a string, got {other}"))),
        None => Err(invalid_args(tool, format!("missing required argument `{key}` (a string)"))),
    }
}

/// An optional string argument; absent, null and blank all mean "not given".
pub(crate) fn optional_str(args: &Value, key: &str, tool: &str) -> Result<Option<String>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if text.trim().is_empty() => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(invalid_args(tool, format!("`{key}` must be a string, got {other}"))),
    }
}

/// An optional boolean argument (`"true"`/`"false"` strings are accepted too).
pub(crate) fn optional_bool(args: &Value, key: &str, tool: &str) -> Result<Option<bool>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(Value::String(text)) if text == "true" => Ok(Some(true)),
        Some(Value::String(text)) if text == "false" => Ok(Some(false)),
        Some(other) => Err(invalid_args(tool, format!("`{key}` must be true or false, got {other}"))),
    }
}

/// An optional non-negative whole number (integral floats and numeric strings are accepted).
pub(crate) fn optional_u64(args: &Value, key: &str, tool: &str) -> Result<Option<u64>, ToolError> {
    let value = match args.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(value) => value,
    };
    let number = value
        .as_u64()
        .or_else(|| {
            value.as_f64().filter(|f| (0.0..=u64::MAX as f64).contains(f) && f.fract() == 0.0).map(|f| f as u64)
        })
        .or_else(|| value.as_str().and_then(|s| s.trim().parse::<u64>().ok()));
    match number {
        Some(number) => Ok(Some(number)),
        None => Err(invalid_args(tool, format!("`{key}` must be a non-negative whole number, got {value}"))),
    }
}

/// Runs blocking work (file IO, directory walks) on tokio's blocking pool.
pub(crate) async fn run_blocking<T, F>(what: &str, work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => Err(ToolError::new("INTERNAL", format!("{what} failed unexpectedly: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Access;
    use serde_json::json;

    #[test]
    fn registers_every_coding_tool() {
        let mut registry = ToolRegistry::new();
        register_coding_tools(&mut registry, FileState::default());
        let names: Vec<String> = registry.schemas().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["bash", "edit", "glob", "grep", "read", "todo_write", "write"]);
        assert!(registry.is_parallel_safe("read"));
        assert!(registry.is_parallel_safe("grep"));
        assert!(!registry.is_parallel_safe("bash"));
        assert!(!registry.is_parallel_safe("edit"));
    }

    #[test]
    fn each_tool_titles_its_calls_and_says_what_they_touch() {
        let mut registry = ToolRegistry::new();
        register_coding_tools(&mut registry, FileState::default());
        let shown = |name: &str, args: Value| registry.shown(name, &args);
        let paths = |p: &[&str]| p.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(
            shown("read", json!({"file_path": "a.rs", "offset": 7})),
            ("Read a.rs".into(), Access::Read { paths: paths(&["a.rs"]), line: Some(7) })
        );
        assert_eq!(
            shown("write", json!({"file_path": "a.md"})),
            ("Write a.md".into(), Access::Edit { paths: paths(&["a.md"]) })
        );
        assert_eq!(shown("edit", json!({"file_path": 3})), ("Edit ".into(), Access::Edit { paths: Vec::new() }));
        assert_eq!(
            shown("grep", json!({"pattern": "fn", "path": "src"})),
            ("grep fn in src".into(), Access::Search { paths: paths(&["src"]) })
        );
        assert_eq!(
            shown("glob", json!({"pattern": "*.rs"})),
            ("glob *.rs".into(), Access::Search { paths: Vec::new() })
        );
        assert_eq!(
            shown("bash", json!({"command": "ls", "description": "List", "workdir": "sub"})).1,
            Access::Execute { command: "ls".into(), workdir: Some("sub".into()) }
        );
        assert_eq!(shown("todo_write", json!({"todos": []})), ("Update plan".into(), Access::Plan));
        let advice: Vec<String> = registry.guidance().into_iter().map(|(name, _)| name).collect();
        assert_eq!(advice, ["read", "glob", "grep", "edit", "write", "bash", "todo_write"]);
    }

    #[test]
    fn checks_refuse_what_the_call_would_refuse_with_the_same_error() {
        let mut registry = ToolRegistry::new();
        register_coding_tools(&mut registry, FileState::default());
        let bad = [
            ("read", json!({"file_path": "a", "limit": 0})),
            ("write", json!({"file_path": "a"})),
            ("edit", json!({"file_path": "a", "old_string": "x", "new_string": "x"})),
            ("glob", json!({"pattern": 1})),
            ("grep", json!({"pattern": "a", "include": 2})),
            ("bash", json!({"command": " "})),
        ];
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for (name, args) in bad {
            let tool = registry.get(name).unwrap();
            let refused = tool.check(&args).unwrap_err();
            let dir = tempfile::tempdir().unwrap();
            let ctx = ToolContext::detached(Some(dir.path().to_path_buf()), tokio_util::sync::CancellationToken::new());
            let failed = runtime.block_on(registry.call(name, &args.to_string(), ctx)).unwrap_err();
            assert_eq!(refused, failed, "{name}");
        }
        assert!(registry.get("read").unwrap().check(&json!({"file_path": "a"})).is_ok());
    }

    #[test]
    fn argument_helpers_accept_lenient_forms_and_name_bad_ones() {
        let args = json!({"n": 5.0, "s": "7", "b": "true", "blank": " ", "bad": [1]});
        assert_eq!(optional_u64(&args, "n", "t").unwrap(), Some(5));
        assert_eq!(optional_u64(&args, "s", "t").unwrap(), Some(7));
        assert_eq!(optional_u64(&args, "missing", "t").unwrap(), None);
        assert_eq!(optional_bool(&args, "b", "t").unwrap(), Some(true));
        assert_eq!(optional_str(&args, "blank", "t").unwrap(), None);
        let err = optional_u64(&args, "bad", "t").unwrap_err();
        assert_eq!(err.code, "INVALID_ARGUMENTS");
        assert!(err.message.contains("`bad`"), "{}", err.message);
        let err = required_str(&args, "file_path", "read").unwrap_err();
        assert!(err.message.contains("file_path"), "{}", err.message);
    }
}
