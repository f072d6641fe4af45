//! What the tools share about a call: its arguments read out of the JSON object with clear
//! errors, its working directory, the error of a cancelled call, and blocking IO run off the
//! async threads. The tools depend on this; it depends on no tool.

use std::fmt::Display;
use std::path::PathBuf;

use serde_json::Value;

use super::{ToolContext, ToolError};

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
    use serde_json::json;

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
