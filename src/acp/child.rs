//! ACP for external agents run as children (`subagent::external`): the provider's `RemoteAgent`
//! port on kin's client connection (`peer`). The handshake (`initialize` with the file methods
//! the policy serves, the protocol version checked, then `session/new`), the prompt and its stop
//! reason, `session/cancel`; the agent's updates of its own session become answer text and tool
//! calls, and its permission and `fs/*` requests are mapped to the provider's terms and back.
//! Frames from the agent are capped at `MAX_FRAME` bytes: a longer line ends the run's connection.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, FileSystemCapabilities, Implementation, InitializeRequest,
    NewSessionRequest, NewSessionResponse, PermissionOptionKind, PromptRequest, PromptResponse, ReadTextFileRequest,
    ReadTextFileResponse, RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionNotification, SessionUpdate, StopReason, ToolKind, WriteTextFileRequest,
};
use agent_client_protocol::{Error, ErrorCode};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::time::Instant;

use super::peer::{AgentPeer, ClientSide};
use super::wire::{WireOptions, excerpt, numbering};
use crate::subagent::external::port::{
    Failure, FileOffer, OfferKind, PermissionAsk, PermissionChoice, PermissionOffer, Refusal, RefusalKind, RemoteAgent,
    RemoteAnswers, RemoteSession, RemoteStop, StartFailure,
};

/// The ACP protocol version kin speaks as a client.
pub(super) const PROTOCOL_VERSION: u16 = 1;
/// The longest line an external agent may write: one JSON-RPC frame, 16 MiB.
pub(crate) const MAX_FRAME: usize = 16 << 20;

/// The `RemoteAgent` of `[acp_agents.*]`.
pub(crate) struct ExternalAgents;

impl RemoteAgent for ExternalAgents {
    fn connect(
        &self,
        provider: &str,
        root: &Path,
        stdin: ChildStdin,
        stdout: ChildStdout,
        answers: Arc<dyn RemoteAnswers>,
    ) -> BoxFuture<'static, Result<Box<dyn RemoteSession>, String>> {
        let provider = provider.to_string();
        let root = root.to_path_buf();
        async move {
            let side = Arc::new(Side { answers, root, session: Mutex::new(None) });
            let options = WireOptions { max_frame: MAX_FRAME, tap: None, strict: true, numbering: numbering() };
            let peer = AgentPeer::connect(&provider, stdin, stdout, side.clone(), options).await?;
            Ok(Box::new(Child { peer: Arc::new(peer), side }) as Box<dyn RemoteSession>)
        }
        .boxed()
    }
}

/// What the agent's requests and updates reach.
struct Side {
    answers: Arc<dyn RemoteAnswers>,
    /// The run's working directory: relative paths the agent names resolve against it.
    root: PathBuf,
    /// The run's session (set after `session/new`): only its updates count.
    session: Mutex<Option<String>>,
}

/// One run's connection.
struct Child {
    peer: Arc<AgentPeer>,
    side: Arc<Side>,
}

impl RemoteSession for Child {
    fn start(
        &self,
        cwd: &Path,
        offer: FileOffer,
        deadline: Instant,
    ) -> BoxFuture<'static, Result<String, StartFailure>> {
        let (peer, side, cwd) = (self.peer.clone(), self.side.clone(), cwd.to_path_buf());
        async move {
            let fs = FileSystemCapabilities::new().read_text_file(offer.read).write_text_file(offer.write);
            let init = InitializeRequest::new(ProtocolVersion::from(PROTOCOL_VERSION))
                .client_capabilities(ClientCapabilities::new().fs(fs).terminal(false))
                .client_info(Implementation::new("kin", env!("CARGO_PKG_VERSION")));
            let answer = step(&peer, "initialize", &init, deadline).await?;
            match answer.get("protocolVersion") {
                Some(version) if version.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
                Some(Value::Number(other)) => {
                    return Err(StartFailure::Other(format!(
                        "the child agent speaks ACP protocol version {other}; kin speaks version {PROTOCOL_VERSION}"
                    )));
                }
                Some(other) => {
                    return Err(StartFailure::Other(format!(
                        "the child agent's initialize answer gives protocolVersion {}, not a version number (kin speaks version {PROTOCOL_VERSION})",
                        crate::session::cut_chars(&other.to_string(), 100)
                    )));
                }
                None => {
                    return Err(StartFailure::Other(format!(
                        "the child agent's initialize answer has no protocolVersion: {}",
                        excerpt(&answer.to_string())
                    )));
                }
            }
            let answer = step(&peer, "session/new", &NewSessionRequest::new(cwd), deadline).await?;
            let Ok(created) = serde_json::from_value::<NewSessionResponse>(answer.clone()) else {
                return Err(StartFailure::Other(format!(
                    "the child agent's session/new answer has no sessionId: {}",
                    excerpt(&answer.to_string())
                )));
            };
            let id = created.session_id.0.to_string();
            *side.session.lock().unwrap_or_else(PoisonError::into_inner) = Some(id.clone());
            Ok(id)
        }
        .boxed()
    }

    fn prompt(&self, session_id: &str, prompt: Vec<Value>) -> BoxFuture<'static, Result<RemoteStop, Failure>> {
        let peer = self.peer.clone();
        let session_id = session_id.to_string();
        async move {
            let content: Vec<ContentBlock> = serde_json::from_value(Value::Array(prompt))
                .map_err(|e| Failure::Invalid(format!("the prompt is not ACP content: {e}")))?;
            let answer = peer.call(&PromptRequest::new(session_id, content)).await.map_err(|e| failure(&peer, e))?;
            stop_of(&answer)
        }
        .boxed()
    }

    fn cancel(&self, session_id: &str) -> BoxFuture<'static, ()> {
        let peer = self.peer.clone();
        let notification = CancelNotification::new(session_id.to_string());
        async move {
            if let Err(e) = peer.notify(&notification).await {
                tracing::debug!("cannot cancel the child agent's turn: {e}");
            }
        }
        .boxed()
    }

    fn close(&self) -> BoxFuture<'static, ()> {
        let peer = self.peer.clone();
        async move { peer.close().await }.boxed()
    }
}

/// One handshake request under the startup deadline.
async fn step<Req: agent_client_protocol::JsonRpcRequest>(
    peer: &AgentPeer,
    method: &'static str,
    request: &Req,
    deadline: Instant,
) -> Result<Value, StartFailure> {
    match tokio::time::timeout_at(deadline, peer.call(request)).await {
        Err(_) => Err(StartFailure::Timeout(method)),
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(match failure(peer, e) {
            Failure::Rpc { code, message } => StartFailure::Refused { method, code, message },
            Failure::Broken(reason) => StartFailure::Broken(reason),
            Failure::Violated(reason) => StartFailure::Violated(reason),
            Failure::Invalid(cause) => StartFailure::Other(cause),
        }),
    }
}

/// A request's error: the connection's end when it broke, else the agent's answer.
fn failure(peer: &AgentPeer, error: Error) -> Failure {
    match peer.broken() {
        Some(broken) if broken.violation => Failure::Violated(broken.reason),
        Some(broken) => Failure::Broken(broken.reason),
        None if agent_client_protocol::is_incoming_transport_closed(&error) => {
            Failure::Broken("closed the connection".into())
        }
        None => Failure::Rpc { code: i64::from(i32::from(error.code)), message: error.message },
    }
}

/// The stop reason of a `session/prompt` answer.
fn stop_of(answer: &Value) -> Result<RemoteStop, Failure> {
    match serde_json::from_value::<PromptResponse>(answer.clone()) {
        Ok(response) => Ok(match response.stop_reason {
            StopReason::EndTurn => RemoteStop::EndTurn,
            StopReason::MaxTokens => RemoteStop::MaxTokens,
            StopReason::Refusal => RemoteStop::Refusal,
            StopReason::Cancelled => RemoteStop::Cancelled,
            StopReason::MaxTurnRequests => RemoteStop::Other("max_turn_requests".into()),
            other => RemoteStop::Other(format!("{other:?}")),
        }),
        Err(_) => match answer.get("stopReason").and_then(Value::as_str) {
            Some(other) => Ok(RemoteStop::Other(other.to_string())),
            None => Err(Failure::Invalid("the child agent's session/prompt answer has no stopReason".into())),
        },
    }
}

/// Where a path an agent names points, as the agent would take it: against the working directory
/// `root` when relative, `~` and `~/…` in the home directory (a shell or an agent expands them,
/// so `~/.ssh/id_rsa` is not a workspace file named `~`). `None` for one kin cannot follow
/// (`~user/…`, a `$VARIABLE` in it, or `~` without a home directory).
fn agent_path(root: &Path, raw: &str, home: Option<&Path>) -> Option<PathBuf> {
    if raw.contains('$') {
        return None;
    }
    match raw.strip_prefix('~') {
        None => Some(crate::tools::paths::resolve(root, raw)),
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            Some(crate::tools::paths::resolve(home?, rest.trim_start_matches('/')))
        }
        Some(_) => None,
    }
}

impl ClientSide for Side {
    fn permission(&self, request: RequestPermissionRequest) -> BoxFuture<'_, Result<RequestPermissionResponse, Error>> {
        async move {
            let fields = request.tool_call.fields;
            let raw_input = fields.raw_input.unwrap_or(Value::Null);
            let located = fields.locations.into_iter().flatten().map(|l| l.path);
            let named = ["path", "file_path", "filePath"].into_iter().filter_map(|key| raw_input[key].as_str());
            let home = std::env::var_os("HOME").map(PathBuf::from);
            let (mut paths, mut opaque) = (Vec::new(), Vec::new());
            for raw in located.chain(named.map(PathBuf::from)) {
                let raw = raw.to_string_lossy();
                match agent_path(&self.root, &raw, home.as_deref()) {
                    Some(path) => paths.push(path),
                    None => opaque.push(raw.into_owned()),
                }
            }
            let kind = fields.kind.unwrap_or_default();
            let options = request
                .options
                .into_iter()
                .filter_map(|o| Some(PermissionOffer { id: o.option_id.0.to_string(), kind: offer_kind(o.kind)? }))
                .collect();
            let ask = PermissionAsk {
                kind: kind_name(kind),
                access: super::convert::access_of_kind(kind, paths.clone()),
                title: fields.title,
                raw_input,
                paths,
                opaque,
                options,
            };
            let outcome = match self.answers.permission(ask).await {
                PermissionChoice::Selected(id) => {
                    RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id))
                }
                PermissionChoice::Cancelled => RequestPermissionOutcome::Cancelled,
            };
            Ok(RequestPermissionResponse::new(outcome))
        }
        .boxed()
    }

    fn read_text_file(&self, request: ReadTextFileRequest) -> BoxFuture<'_, Result<ReadTextFileResponse, Error>> {
        async move {
            let text = self.answers.read_text_file(request.path, request.line, request.limit).await;
            text.map(ReadTextFileResponse::new).map_err(refusal)
        }
        .boxed()
    }

    fn write_text_file(&self, request: WriteTextFileRequest) -> BoxFuture<'_, Result<(), Error>> {
        async move {
            let path: PathBuf = request.path;
            self.answers.write_text_file(path, request.content).await.map_err(refusal)
        }
        .boxed()
    }

    fn update(&self, notification: SessionNotification) {
        let ours = self.session.lock().unwrap_or_else(PoisonError::into_inner).as_deref()
            == Some(notification.session_id.0.as_ref());
        if !ours {
            return;
        }
        match notification.update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let ContentBlock::Text(text) = chunk.content {
                    self.answers.text(&text.text);
                }
            }
            SessionUpdate::ToolCall(call) => self.answers.tool_call(&call.title),
            _ => {}
        }
    }
}

/// The agent's name for a tool call's kind.
fn kind_name(kind: ToolKind) -> &'static str {
    match kind {
        ToolKind::Read => "read",
        ToolKind::Edit => "edit",
        ToolKind::Delete => "delete",
        ToolKind::Move => "move",
        ToolKind::Search => "search",
        ToolKind::Execute => "execute",
        ToolKind::Think => "think",
        ToolKind::Fetch => "fetch",
        ToolKind::SwitchMode => "switch_mode",
        // `other`, and kinds newer than this schema.
        _ => "other",
    }
}

/// An option kind kin can choose; kinds newer than this schema are never chosen. (A kind the
/// SDK itself does not know fails the request's parse: the agent's request is refused whole,
/// `-32602`, which chooses nothing either.)
fn offer_kind(kind: PermissionOptionKind) -> Option<OfferKind> {
    match kind {
        PermissionOptionKind::AllowOnce => Some(OfferKind::AllowOnce),
        PermissionOptionKind::AllowAlways => Some(OfferKind::AllowAlways),
        PermissionOptionKind::RejectOnce => Some(OfferKind::RejectOnce),
        PermissionOptionKind::RejectAlways => Some(OfferKind::RejectAlways),
        _ => None,
    }
}

/// A refused file request as the JSON-RPC error the agent gets.
fn refusal(refusal: Refusal) -> Error {
    let code = match refusal.kind {
        RefusalKind::InvalidParams => -32602,
        RefusalKind::NotFound => -32002,
        RefusalKind::Internal => -32603,
    };
    Error::new(ErrorCode::from(code), refusal.message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Access;

    #[test]
    fn stop_reasons_read_from_the_answer() {
        let of = |answer: Value| stop_of(&answer);
        assert_eq!(of(serde_json::json!({"stopReason": "end_turn"})), Ok(RemoteStop::EndTurn));
        assert_eq!(of(serde_json::json!({"stopReason": "cancelled"})), Ok(RemoteStop::Cancelled));
        assert_eq!(
            of(serde_json::json!({"stopReason": "max_turn_requests"})),
            Ok(RemoteStop::Other("max_turn_requests".into()))
        );
        assert_eq!(of(serde_json::json!({"stopReason": "napping"})), Ok(RemoteStop::Other("napping".into())));
        assert!(matches!(of(serde_json::json!({})), Err(Failure::Invalid(_))));
    }

    /// Keeps the last permission question and answers it with its first offer.
    #[derive(Default)]
    struct Asked(Mutex<Option<PermissionAsk>>);

    impl RemoteAnswers for Asked {
        fn permission(&self, ask: PermissionAsk) -> BoxFuture<'_, PermissionChoice> {
            let choice =
                ask.options.first().map_or(PermissionChoice::Cancelled, |o| PermissionChoice::Selected(o.id.clone()));
            *self.0.lock().unwrap() = Some(ask);
            async move { choice }.boxed()
        }
        fn read_text_file(&self, _: PathBuf, _: Option<u32>, _: Option<u32>) -> BoxFuture<'_, Result<String, Refusal>> {
            async { Ok(String::new()) }.boxed()
        }
        fn write_text_file(&self, _: PathBuf, _: String) -> BoxFuture<'_, Result<(), Refusal>> {
            async { Ok(()) }.boxed()
        }
        fn text(&self, _: &str) {}
        fn tool_call(&self, _: &str) {}
    }

    #[tokio::test]
    async fn a_permission_request_becomes_a_question_in_kins_terms() {
        let asked = Arc::new(Asked::default());
        let side = Side { answers: asked.clone(), root: PathBuf::from("/ws"), session: Mutex::new(None) };
        let request: RequestPermissionRequest = serde_json::from_value(serde_json::json!({
            "sessionId": "s",
            "toolCall": {"toolCallId": "t", "kind": "edit", "title": "Edit two files",
                "locations": [{"path": "/ws/a.rs"}], "rawInput": {"file_path": "src/b.rs"}},
            "options": [{"optionId": "ok", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "no", "name": "Reject", "kind": "reject_always"}],
        }))
        .unwrap();
        let answer = side.permission(request).await.unwrap();
        assert_eq!(
            serde_json::to_value(answer).unwrap(),
            serde_json::json!({"outcome": {"outcome": "selected", "optionId": "ok"}})
        );
        let ask = asked.0.lock().unwrap().clone().unwrap();
        assert!(ask.opaque.is_empty());
        let paths = vec![PathBuf::from("/ws/a.rs"), PathBuf::from("/ws/src/b.rs")];
        assert_eq!((ask.kind, &ask.access, &ask.paths), ("edit", &Access::Edit { paths: paths.clone() }, &paths));
        assert_eq!(ask.title.as_deref(), Some("Edit two files"));
        let offered: Vec<(&str, OfferKind)> = ask.options.iter().map(|o| (o.id.as_str(), o.kind)).collect();
        assert_eq!(offered, [("ok", OfferKind::AllowOnce), ("no", OfferKind::RejectAlways)]);
    }

    #[test]
    fn a_path_is_taken_as_the_agent_would_take_it() {
        let (root, home) = (Path::new("/ws"), Some(Path::new("/home/u")));
        let path = |raw: &str| agent_path(root, raw, home);
        assert_eq!(path("src/a.rs"), Some(PathBuf::from("/ws/src/a.rs")));
        assert_eq!(path("/etc/passwd"), Some(PathBuf::from("/etc/passwd")));
        assert_eq!(path("~/.ssh/id_rsa"), Some(PathBuf::from("/home/u/.ssh/id_rsa")), "not /ws/~/.ssh/id_rsa");
        assert_eq!(path("~"), Some(PathBuf::from("/home/u")));
        assert_eq!(path("~root/.ssh/id_rsa"), None, "another user's home");
        assert_eq!(path("$HOME/.ssh/id_rsa"), None);
        assert_eq!(path("src/${X}/a"), None);
        assert_eq!(agent_path(root, "~/.ssh", None), None, "no home directory known");
    }

    #[tokio::test]
    async fn a_question_naming_a_home_path_is_not_a_workspace_question() {
        let asked = Arc::new(Asked::default());
        let side = Side { answers: asked.clone(), root: PathBuf::from("/ws"), session: Mutex::new(None) };
        let request: RequestPermissionRequest = serde_json::from_value(serde_json::json!({
            "sessionId": "s",
            "toolCall": {"toolCallId": "t", "kind": "read", "title": "Read README.md",
                "locations": [{"path": "~/.ssh/id_rsa"}], "rawInput": {"path": "$HOME/.aws/credentials"}},
            "options": [{"optionId": "ok", "name": "Allow", "kind": "allow_once"}],
        }))
        .unwrap();
        side.permission(request).await.unwrap();
        let ask = asked.0.lock().unwrap().clone().unwrap();
        assert!(ask.paths.iter().all(|p| !p.starts_with("/ws")), "{:?}", ask.paths);
        assert_eq!(ask.opaque, ["$HOME/.aws/credentials"]);
    }

    #[test]
    fn only_the_runs_own_session_counts() {
        /// Collects the answer text and the tool calls.
        struct Texts(Mutex<String>);
        let texts = Arc::new(Texts(Mutex::new(String::new())));
        impl RemoteAnswers for Texts {
            fn permission(&self, _: PermissionAsk) -> BoxFuture<'_, PermissionChoice> {
                async { PermissionChoice::Cancelled }.boxed()
            }
            fn read_text_file(
                &self,
                _: PathBuf,
                _: Option<u32>,
                _: Option<u32>,
            ) -> BoxFuture<'_, Result<String, Refusal>> {
                async { Ok(String::new()) }.boxed()
            }
            fn write_text_file(&self, _: PathBuf, _: String) -> BoxFuture<'_, Result<(), Refusal>> {
                async { Ok(()) }.boxed()
            }
            fn text(&self, text: &str) {
                self.0.lock().unwrap().push_str(text);
            }
            fn tool_call(&self, title: &str) {
                self.0.lock().unwrap().push_str(&format!("[{title}]"));
            }
        }
        let side = Side { answers: texts.clone(), root: PathBuf::from("/ws"), session: Mutex::new(None) };
        let update = |session: &str, update: Value| -> SessionNotification {
            serde_json::from_value(serde_json::json!({"sessionId": session, "update": update})).unwrap()
        };
        let chunk =
            serde_json::json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}});
        let call = serde_json::json!({"sessionUpdate": "tool_call", "toolCallId": "t", "title": "Run tests"});
        side.update(update("s1", chunk.clone()));
        *side.session.lock().unwrap() = Some("s1".into());
        side.update(update("s1", chunk.clone()));
        side.update(update("s1", call));
        side.update(update("other", chunk));
        assert_eq!(*texts.0.lock().unwrap(), "hi[Run tests]");
    }
}
