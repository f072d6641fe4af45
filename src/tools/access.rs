//! What a tool call touches, as its tool declares it for the call's arguments (`Tool::access`):
//! the permission gate decides on it (`permission`), and the editor shows its kind and locations
//! (`acp::convert`). The set is closed and every match on it is exhaustive, so a new kind of
//! access makes the gate and the editor say what it means. A tool kin cannot see into (an MCP
//! tool, a call of an external agent of a kind kin has no word for, or of kind `think`, which
//! should need no permission) is `External`, which the gate asks about and read-only mode refuses.

use std::path::PathBuf;

/// What one call touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Reads the files at `paths` (as the call names them); `line` is where the read starts when
    /// the call says.
    Read { paths: Vec<PathBuf>, line: Option<u64> },
    /// Searches under `paths` (none named: the workspace).
    Search { paths: Vec<PathBuf> },
    /// Creates or changes the files at `paths`.
    Edit { paths: Vec<PathBuf> },
    /// Removes the files at `paths`.
    Delete { paths: Vec<PathBuf> },
    /// Moves or renames the files at `paths`.
    Move { paths: Vec<PathBuf> },
    /// Runs `command` in a shell in `workdir` (as the call names it; none: the workspace).
    /// `command` is the whole command line; it is empty when kin does not know it (a forwarded
    /// call of an external agent names its command only in its own title and input).
    Execute { command: String, workdir: Option<PathBuf> },
    /// Runs `command` as `Execute` does, but confined by the session's kernel sandbox, which the
    /// kernel enforces in full here (`sandbox::SessionSandbox::in_force`): it writes only where
    /// the sandbox lets it and reaches the network only when the sandbox keeps it.
    ExecuteSandboxed { command: String, workdir: Option<PathBuf> },
    /// Reaches outside the machine (a URL, a web search).
    Fetch,
    /// Starts, messages, lists or stops agents, or answers the agent that delegated; the calls of
    /// an in-process agent pass this same gate.
    Delegate,
    /// Changes only the agent's own task list.
    Plan,
    /// Does something kin cannot see into (an MCP tool, a delegation to an external agent).
    External,
}

impl Access {
    /// The paths the call names (empty for the kinds that name none).
    pub fn paths(&self) -> &[PathBuf] {
        match self {
            Access::Read { paths, .. }
            | Access::Search { paths }
            | Access::Edit { paths }
            | Access::Delete { paths }
            | Access::Move { paths } => paths,
            Access::Execute { .. }
            | Access::ExecuteSandboxed { .. }
            | Access::Fetch
            | Access::Delegate
            | Access::Plan
            | Access::External => &[],
        }
    }
}

/// The path at `key` of `arguments` when it is a string, as a list of at most one.
pub(crate) fn named_path(arguments: &serde_json::Value, key: &str) -> Vec<PathBuf> {
    arguments[key].as_str().map(PathBuf::from).into_iter().collect()
}
