//! The runtime's error: what a protocol handler turns into an ACP error (`acp::to_acp`).

use crate::session::StoreError;

/// A request the caller got wrong (maps to invalid params), a session id that names no session
/// (not stored, deleted, or not live where it must be), or a failure of kin itself.
#[derive(Debug, Clone, PartialEq)]
pub enum RuntimeError {
    InvalidParams(String),
    /// The session id.
    NotFound(String),
    Internal(String),
}

impl std::fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuntimeError::InvalidParams(m) | RuntimeError::Internal(m) => f.write_str(m),
            RuntimeError::NotFound(id) => write!(f, "unknown session: {id}"),
        }
    }
}

/// A store error as the runtime reports it: a bad id or a refusal is the caller's, a missing
/// log is not found, anything else is kin's.
pub(super) fn store_error(e: StoreError) -> RuntimeError {
    match e {
        StoreError::NotFound(id) => RuntimeError::NotFound(id),
        StoreError::InvalidId(_) | StoreError::Refused(_) => RuntimeError::InvalidParams(e.to_string()),
        StoreError::Scan(_) | StoreError::Io(_) => RuntimeError::Internal(e.to_string()),
    }
}

impl std::error::Error for RuntimeError {}

/// The error for any request but `session/cancel` that names a subagent child.
pub(super) fn subagent_only(id: &str) -> RuntimeError {
    RuntimeError::InvalidParams(format!("{id} is a subagent session; only session/cancel is allowed on it"))
}
