//! The seam between the external-agent provider and the protocol: what the provider needs of an
//! ACP client connection to one agent process (`RemoteAgent`, `RemoteSession`, implemented by
//! `acp::child`), and what that connection needs of the provider (`RemoteAnswers`: the agent's
//! own requests and what it streams). No ACP type crosses it; the protocol module maps its
//! types onto these.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::time::Instant;

use crate::tools::Access;

/// Opens an ACP client connection over an agent process's pipes.
pub trait RemoteAgent: Send + Sync {
    /// The connection: kin writes the agent's stdin and reads its stdout; the agent's requests
    /// and updates go to `answers`. `provider` names the agent in logs; the relative paths the
    /// agent names resolve against `root` (the run's real working directory).
    fn connect(
        &self,
        provider: &str,
        root: &Path,
        stdin: ChildStdin,
        stdout: ChildStdout,
        answers: Arc<dyn RemoteAnswers>,
    ) -> BoxFuture<'static, Result<Box<dyn RemoteSession>, String>>;
}

/// One connection to an agent process, for one run.
pub trait RemoteSession: Send + Sync {
    /// The handshake (protocol version, the file methods kin serves, then a session in `cwd`)
    /// under `deadline`; returns the agent's session id.
    fn start(
        &self,
        cwd: &Path,
        offer: FileOffer,
        deadline: Instant,
    ) -> BoxFuture<'static, Result<String, StartFailure>>;

    /// Sends the prompt and waits for its end (or for the connection to break). Dropping the
    /// future does not withdraw the prompt.
    fn prompt(&self, session_id: &str, prompt: Vec<Value>) -> BoxFuture<'static, Result<RemoteStop, Failure>>;

    /// Asks the agent to cancel the session's turn; it is on the wire before a later `close`.
    fn cancel(&self, session_id: &str) -> BoxFuture<'static, ()>;

    /// Closes the agent's stdin (end of input asks an ACP agent to exit) after what was sent.
    fn close(&self) -> BoxFuture<'static, ()>;
}

/// The file methods kin offers the agent at `initialize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileOffer {
    pub read: bool,
    pub write: bool,
}

/// Why the handshake failed.
#[derive(Debug, Clone, PartialEq)]
pub enum StartFailure {
    /// The connection ended; the text completes "the child agent …".
    Broken(String),
    /// The agent broke the protocol; the text completes "the child agent …".
    Violated(String),
    /// The agent answered `method` with a JSON-RPC error.
    Refused { method: &'static str, code: i64, message: String },
    /// No answer to `method` before the deadline.
    Timeout(&'static str),
    /// The whole cause (a protocol version kin does not speak, an answer that is not valid).
    Other(String),
}

/// A request that did not get a valid result.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// A JSON-RPC error answer.
    Rpc { code: i64, message: String },
    /// The connection ended (the agent closed its stdout, its stdin failed); the text completes
    /// "the child agent …".
    Broken(String),
    /// The agent broke the protocol (a line that is not JSON-RPC, one over the frame cap); the
    /// text completes "the child agent …".
    Violated(String),
    /// The answer is not what the protocol allows; the whole cause.
    Invalid(String),
}

/// How the agent says its turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteStop {
    EndTurn,
    MaxTokens,
    Refusal,
    Cancelled,
    /// Any other reason (its wire name, e.g. `max_turn_requests`): an error for kin.
    Other(String),
}

/// The agent asks whether one of its tool calls may run.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionAsk {
    /// The call's kind as the agent names it (`read`, `edit`, `execute`, … `other`).
    pub kind: &'static str,
    /// What the call touches, by its kind and the paths it names.
    pub access: Access,
    pub title: Option<String>,
    pub raw_input: Value,
    /// Every path the call names (its locations and a `path` / `file_path` / `filePath` input),
    /// resolved against the working directory (`~/…` in the home directory).
    pub paths: Vec<PathBuf>,
    /// The paths it names that kin cannot resolve (`~user/…`, `$HOME/…`), as named: such a call
    /// is never taken to stay in the working directory, and the question shows them.
    pub opaque: Vec<String>,
    pub options: Vec<PermissionOffer>,
}

/// One answer the agent offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionOffer {
    pub id: String,
    pub kind: OfferKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfferKind {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
}

/// kin's answer to a permission request: one of the offered ids, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionChoice {
    Selected(String),
    Cancelled,
}

/// A refused file request: the JSON-RPC error class and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: RefusalKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// The request itself is wrong (a relative path).
    InvalidParams,
    /// The file does not exist.
    NotFound,
    /// Refused or failed (policy, outside the working directory, not a regular file, I/O).
    Internal,
}

impl Refusal {
    pub fn new(kind: RefusalKind, message: impl Into<String>) -> Self {
        Refusal { kind, message: message.into() }
    }
}

/// What an agent asks of kin and tells it during a run, answered under the provider's policy.
pub trait RemoteAnswers: Send + Sync {
    fn permission(&self, ask: PermissionAsk) -> BoxFuture<'_, PermissionChoice>;

    /// `fs/read_text_file`: the text of `path` (from 1-based `line`, at most `limit` lines).
    fn read_text_file(
        &self,
        path: PathBuf,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> BoxFuture<'_, Result<String, Refusal>>;

    /// `fs/write_text_file`.
    fn write_text_file(&self, path: PathBuf, content: String) -> BoxFuture<'_, Result<(), Refusal>>;

    /// A piece of the agent's answer text in the run's session.
    fn text(&self, text: &str);

    /// The agent started a tool call titled `title` in the run's session.
    fn tool_call(&self, title: &str);
}
