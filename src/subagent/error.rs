//! Subagent errors with stable codes (dsh `SubagentError` and friends, dsh-design.md §1.6.6).

/// Why a subagent operation failed; `code()` is the stable string logged with tool results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    DuplicateProvider,
    NoProvider,
    UnsupportedCapability,
    NotResumable,
    Unauthorized,
    ParentUnavailable,
    ActivationClosing,
    Draining,
    SessionQueryUnavailable,
    Cancelled,
    /// The requested depth exceeds the tool's `maxDepth` (dsh `SubagentDepthError`).
    Depth,
    /// A bad request (maxDepth not a safe integer, schema not object-rooted…).
    InvalidRequest,
    /// kin itself failed (storage, a dead actor).
    Infrastructure,
    /// An external child agent could not be started (missing command, failed handshake).
    StartFailed,
    /// A session-query failure that fails a whole operation (the initial trace of a listing, a
    /// window error), carrying the query's own stable code (`SESSION_QUERY_PERSISTENCE_FAILED`…).
    Query(&'static str),
}

impl ErrorCode {
    pub fn code(self) -> &'static str {
        match self {
            ErrorCode::DuplicateProvider => "DUPLICATE_PROVIDER",
            ErrorCode::NoProvider => "NO_PROVIDER",
            ErrorCode::UnsupportedCapability => "UNSUPPORTED_CAPABILITY",
            ErrorCode::NotResumable => "NOT_RESUMABLE",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::ParentUnavailable => "PARENT_UNAVAILABLE",
            ErrorCode::ActivationClosing => "ACTIVATION_CLOSING",
            ErrorCode::Draining => "DRAINING",
            ErrorCode::SessionQueryUnavailable => "SUBAGENT_CONTROL_SESSION_QUERY_UNAVAILABLE",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::Depth => "SUBAGENT_DEPTH",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::Infrastructure => "SUBAGENT_INFRASTRUCTURE",
            ErrorCode::StartFailed => "SUBAGENT_START_FAILED",
            ErrorCode::Query(code) => code,
        }
    }

    /// The error class name recorded beside the code.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Depth => "SubagentDepthError",
            ErrorCode::InvalidRequest => "TypeError",
            ErrorCode::Query(_) => "SessionQueryError",
            _ => "SubagentError",
        }
    }
}

/// A subagent failure: a code and the exact model-visible message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubagentError {
    pub code: ErrorCode,
    pub message: String,
}

impl SubagentError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        SubagentError { code, message: message.into() }
    }
}

impl std::fmt::Display for SubagentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SubagentError {}

impl From<SubagentError> for crate::tools::ToolError {
    fn from(e: SubagentError) -> Self {
        crate::tools::ToolError::named(e.code.name(), e.code.code(), e.message)
    }
}
