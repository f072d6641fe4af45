//! The built-in coding tools (`read`, `write`, `edit`, `glob`, `grep`, `bash`, `todo_write`):
//! one call registers them all (the helpers they share are in `args`).

use std::sync::Arc;

use super::ToolRegistry;
use super::bash::BashTool;
use super::fs::{EditTool, FileState, ReadTool, WriteTool};
use super::search::{GlobTool, GrepTool};
use super::todo::TodoWriteTool;

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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::{Value, json};

    use super::*;
    use crate::tools::{Access, ToolContext};

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
}
