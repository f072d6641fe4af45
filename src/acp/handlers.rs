//! One handler per ACP method kin serves as the agent, on `AcpServer` (the runtime, the agent
//! tree shown to the editor, and whether the editor shows `notice` updates). `serve_until`
//! registers each with the SDK's builder. A handler converts the request, makes one call into
//! the runtime and converts its answer; work that waits (a turn, a load, a close, a setting
//! being written to the session's log) runs on a spawned task so the dispatch loop never blocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, CloseSessionRequest, CloseSessionResponse, CurrentModeUpdate,
    DeleteSessionRequest, DeleteSessionResponse, ForkSessionRequest, ForkSessionResponse, Implementation,
    InitializeRequest, InitializeResponse, ListSessionsRequest, ListSessionsResponse, LoadSessionRequest,
    LoadSessionResponse, McpCapabilities, NewSessionRequest, NewSessionResponse, PromptCapabilities, PromptRequest,
    PromptResponse, ResumeSessionRequest, ResumeSessionResponse, SessionCapabilities, SessionCloseCapabilities,
    SessionDeleteCapabilities, SessionForkCapabilities, SessionInfo, SessionListCapabilities, SessionNotification,
    SessionResumeCapabilities, SessionUpdate, SetSessionConfigOptionRequest, SetSessionConfigOptionResponse,
    SetSessionModeRequest, SetSessionModeResponse, StopReason,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Client, Error, JsonRpcResponse};

use super::tree::{self, ChildForwarders, Forwarder, Tree};
use super::{
    after_response, auth_methods, auth_required, client, config_options, convert, internal, invalid_params, mcp, modes,
    no_images, session_meta, to_acp, unsupported_params,
};
use crate::runtime::{ChildObservers, Loaded, Runtime, RuntimeError, SessionView};

/// `$response` (a session-opening answer) with the session's modes, config options and `_meta`.
macro_rules! with_view {
    ($response:expr, $view:expr) => {{
        let view: &SessionView = $view;
        $response.modes(modes::state(view.mode)).config_options(config_options(view)).meta(session_meta(view))
    }};
}

/// Which of the two requests that reopen a stored or live session is served.
#[derive(Clone, Copy)]
enum Reopen {
    /// `session/load`: the session's events and children are replayed to the client.
    Load,
    /// `session/resume`: reattached without replay.
    Resume,
}

/// What every handler works with; cheap to clone (a spawned task takes a copy).
#[derive(Clone)]
pub(super) struct AcpServer {
    pub(super) runtime: Arc<Runtime>,
    /// The agent tree shown to a client that advertised subagent sessions.
    pub(super) tree: Arc<Tree>,
    /// Whether the client shows `notice` updates (`clientCapabilities.session.notices`).
    pub(super) notices: Arc<AtomicBool>,
}

impl AcpServer {
    pub(super) fn new(runtime: Arc<Runtime>) -> Self {
        let tree = Arc::new(Tree::new(runtime.models()));
        AcpServer { runtime, tree, notices: Arc::new(AtomicBool::new(false)) }
    }

    /// The forwarder of a top-level session's events to the client.
    fn forwarder(&self, cx: &ConnectionTo<Client>) -> Arc<Forwarder> {
        Arc::new(Forwarder::new(cx.clone(), self.tree.clone(), self.runtime.tools().clone()))
    }

    /// Answers a session-opening request (`session/new`, `session/fork`) with `response` of the
    /// session it made, then offers its commands and MCP notices.
    fn opened<R: JsonRpcResponse>(
        &self,
        cx: &ConnectionTo<Client>,
        responder: Responder<R>,
        opened: Result<SessionView, RuntimeError>,
        response: impl FnOnce(&SessionView) -> R,
    ) -> Result<(), Error> {
        match opened {
            Ok(view) => {
                let sent = responder.respond(response(&view));
                after_response(cx, &self.runtime, &view.id, &self.notices);
                sent
            }
            Err(e) => responder.respond_with_error(to_acp(e)),
        }
    }

    pub(super) fn initialize(
        &self,
        req: InitializeRequest,
        responder: Responder<InitializeResponse>,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        // Permission requests always go to the client; files only when it offers them.
        let fs = &req.client_capabilities.fs;
        // The agent tree is shown only to clients that advertised subagent sessions.
        let subagents = req.client_capabilities.subagents.is_some();
        let parent_of: Option<client::ParentOf> = subagents.then(|| {
            let runtime = Arc::downgrade(&self.runtime);
            Arc::new(move |id: &str| runtime.upgrade().and_then(|rt| rt.parent_of(id))) as client::ParentOf
        });
        let terminal = req.client_capabilities.terminal;
        let mut link = client::link(cx, fs.read_text_file, fs.write_text_file, terminal, parent_of);
        self.tree.set_enabled(subagents);
        if subagents {
            let tools = self.runtime.tools().clone();
            let children = ChildForwarders { cx: cx.clone(), tree: self.tree.clone(), tools };
            link.children = Some(Arc::new(children) as Arc<dyn ChildObservers>);
        }
        self.runtime.connect_client(link);
        let takes_notices = req.client_capabilities.session.as_ref().is_some_and(|s| s.notices.is_some());
        self.notices.store(takes_notices, Ordering::SeqCst);
        let sessions = SessionCapabilities::new()
            .list(SessionListCapabilities::new())
            .fork(SessionForkCapabilities::new())
            .resume(SessionResumeCapabilities::new())
            .close(SessionCloseCapabilities::new())
            .delete(SessionDeleteCapabilities::new());
        let capabilities = AgentCapabilities::new()
            .load_session(true)
            .mcp_capabilities(McpCapabilities::new().http(crate::mcp::HTTP_SUPPORTED))
            .prompt_capabilities(PromptCapabilities::new().image(true).embedded_context(true))
            .session_capabilities(sessions);
        responder.respond(
            InitializeResponse::new(agent_client_protocol::schema::ProtocolVersion::V1)
                .agent_info(Implementation::new("kin", env!("CARGO_PKG_VERSION")))
                .agent_capabilities(capabilities)
                .auth_methods(auth_methods(req.client_capabilities.auth.terminal)),
        )
    }

    pub(super) fn new_session(
        &self,
        req: NewSessionRequest,
        responder: Responder<NewSessionResponse>,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        if let Some(e) = unsupported_params(!req.additional_directories.is_empty(), req.system_prompt.is_some()) {
            return responder.respond_with_error(e);
        }
        if let Some(missing) = self.runtime.missing_key() {
            return responder.respond_with_error(auth_required(&missing));
        }
        let created = self.runtime.new_session_with(&req.cwd, self.forwarder(cx), mcp::specs(&req.mcp_servers));
        self.opened(cx, responder, created, |view| with_view!(NewSessionResponse::new(view.id.clone()), view))
    }

    pub(super) fn fork_session(
        &self,
        req: ForkSessionRequest,
        responder: Responder<ForkSessionResponse>,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        if let Some(e) = unsupported_params(!req.additional_directories.is_empty(), req.system_prompt.is_some()) {
            return responder.respond_with_error(e);
        }
        let servers = mcp::specs(&req.mcp_servers);
        let forked = self.runtime.fork_session(&req.session_id.0, &req.cwd, self.forwarder(cx), servers);
        self.opened(cx, responder, forked, |view| with_view!(ForkSessionResponse::new(view.id.clone()), view))
    }

    pub(super) fn prompt(
        &self,
        req: PromptRequest,
        responder: Responder<PromptResponse>,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        let content = match convert::prompt_content(&req.prompt) {
            Ok(content) => content,
            Err(e) => return responder.respond_with_error(invalid_params(e)),
        };
        let images = content.iter().filter(|b| crate::tools::image::is_image(b)).count();
        let turn = match self.runtime.prompt(&req.session_id.0, content) {
            Ok(turn) => turn,
            Err(e) => return responder.respond_with_error(to_acp(e)),
        };
        if images > 0 && !self.runtime.takes_images(&req.session_id.0) {
            let notice = no_images(&self.runtime, &req.session_id.0, images, self.notices.load(Ordering::SeqCst));
            tree::notify(cx, &req.session_id.0, notice);
        }
        let turn = match turn {
            crate::runtime::Prompted::Turn(turn) => turn,
            crate::runtime::Prompted::Answer(answer) => {
                let (session, to) = (req.session_id.0.to_string(), cx.clone());
                return cx.spawn(async move {
                    let (text, stop) = match answer.await {
                        Ok(answered) if answered.cancelled => (answered.text, StopReason::Cancelled),
                        Ok(answered) => (answered.text, StopReason::EndTurn),
                        Err(_) => ("The command did not finish.".to_string(), StopReason::EndTurn),
                    };
                    tree::notify(&to, &session, convert::agent_text(&text));
                    if let Err(e) = responder.respond(PromptResponse::new(stop)) {
                        tracing::debug!("prompt response not delivered: {e}");
                    }
                    Ok(())
                });
            }
        };
        cx.spawn(async move {
            let end = turn.await.unwrap_or(crate::agent::TurnEnd::Disposed);
            let sent = match convert::stop_reason(&end) {
                Ok(reason) => responder.respond(PromptResponse::new(reason)),
                Err(message) => responder.respond_with_error(internal(format!("turn failed: {message}"))),
            };
            if let Err(e) = sent {
                tracing::debug!("prompt response not delivered: {e}");
            }
            Ok(())
        })
    }

    pub(super) fn cancel(&self, n: &CancelNotification) {
        self.runtime.cancel(&n.session_id.0);
    }

    pub(super) fn load_session(
        &self,
        req: LoadSessionRequest,
        responder: Responder<LoadSessionResponse>,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        if let Some(e) = unsupported_params(!req.additional_directories.is_empty(), req.system_prompt.is_some()) {
            return responder.respond_with_error(e);
        }
        let servers = mcp::specs(&req.mcp_servers);
        self.reopen(Reopen::Load, req.session_id.0.to_string(), servers, responder, cx, |view| {
            with_view!(LoadSessionResponse::new(), view)
        })
    }

    pub(super) fn resume_session(
        &self,
        req: ResumeSessionRequest,
        responder: Responder<ResumeSessionResponse>,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        if let Some(e) = unsupported_params(!req.additional_directories.is_empty(), req.system_prompt.is_some()) {
            return responder.respond_with_error(e);
        }
        let servers = mcp::specs(&req.mcp_servers);
        self.reopen(Reopen::Resume, req.session_id.0.to_string(), servers, responder, cx, |view| {
            with_view!(ResumeSessionResponse::new(), view)
        })
    }

    /// `session/load` or `session/resume` of `id`, on a spawned task: the runtime makes the
    /// session live; a load replays its events and (to a client that shows the agent tree) its
    /// children before the response; both answer with `answer` of its view, re-announce the
    /// children that continue and then let the restored session run.
    fn reopen<R: JsonRpcResponse + Send + 'static>(
        &self,
        how: Reopen,
        id: String,
        servers: Vec<crate::mcp::ServerSpec>,
        responder: Responder<R>,
        cx: &ConnectionTo<Client>,
        answer: fn(&SessionView) -> R,
    ) -> Result<(), Error> {
        let (server, forwarder, cx) = (self.clone(), self.forwarder(cx), cx.clone());
        // Marked now, on the message loop: a prompt read after this request is told to wait for
        // its answer, even before the task below starts.
        let opening = self.runtime.opening(&id);
        cx.clone().spawn(async move {
            let runtime = &server.runtime;
            let opened = match how {
                Reopen::Load => runtime.load_session(&id, forwarder.clone(), servers).await,
                Reopen::Resume => runtime.resume_session(&id, forwarder.clone(), servers).await,
            };
            let Loaded { events, view } = match opened {
                Ok(loaded) => loaded,
                Err(e) => {
                    let _ = responder.respond_with_error(to_acp(e));
                    return Ok(());
                }
            };
            let usage = forwarder.count(&events);
            let tools = runtime.tools();
            let replayed = match how {
                Reopen::Load => {
                    let header = runtime.store().header(&id).ok();
                    let cwd = header.as_ref().map(convert::cwd_of).unwrap_or_default();
                    for update in events.iter().flat_map(|e| convert::replay_updates(&e.body(), tools, &cwd)) {
                        tree::notify(&cx, &id, update);
                    }
                    // Shared with the live session: let go before it appends.
                    drop(events);
                    // The agent tree: children replayed before the response.
                    let children = if server.tree.enabled() { tree::stored_tree(runtime, &id) } else { Vec::new() };
                    tree::replay(&cx, tools, &children);
                    Some(children)
                }
                Reopen::Resume => {
                    drop(events);
                    None
                }
            };
            // The context meter as the log leaves it, before the next model call refreshes it.
            if let Some(usage) = usage {
                tree::notify(&cx, &id, usage);
            }
            let _ = responder.respond(answer(&view));
            drop(opening);
            after_response(&cx, runtime, &id, &server.notices);
            // The continuing children re-announced after the response.
            let children = replayed
                .unwrap_or_else(|| if server.tree.enabled() { tree::stored_tree(runtime, &id) } else { Vec::new() });
            tree::reannounce(&cx, &children);
            runtime.run_restored(&id).await;
            Ok(())
        })
    }

    pub(super) fn set_mode(
        &self,
        req: SetSessionModeRequest,
        responder: Responder<SetSessionModeResponse>,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        let mode = match modes::parse(&req.mode_id.0) {
            Ok(mode) => mode,
            Err(e) => return responder.respond_with_error(invalid_params(e)),
        };
        // Handed to the session now (a prompt sent after this request comes after it); answered
        // once it is on disk, or with why it is not (the mode is then unchanged).
        let recording = match self.runtime.set_permission_mode(&req.session_id.0, mode) {
            Ok(recording) => recording,
            Err(e) => return responder.respond_with_error(to_acp(e)),
        };
        let to = cx.clone();
        cx.spawn(async move {
            let sent = match recording.await {
                Ok(()) => {
                    let update = SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new(mode.id()));
                    if let Err(e) = to.send_notification(SessionNotification::new(req.session_id.clone(), update)) {
                        tracing::debug!("dropping a mode update: {e}");
                    }
                    responder.respond(SetSessionModeResponse::new())
                }
                Err(e) => responder.respond_with_error(to_acp(e)),
            };
            if let Err(e) = sent {
                tracing::debug!("mode response not delivered: {e}");
            }
            Ok(())
        })
    }

    pub(super) fn set_config_option(
        &self,
        req: SetSessionConfigOptionRequest,
        responder: Responder<SetSessionConfigOptionResponse>,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        let (sandbox, hint) = match super::option_values(&req.config_id.0) {
            Ok(known) => known,
            Err(unknown) => return responder.respond_with_error(invalid_params(unknown)),
        };
        let Some(value) = req.value.as_value_id() else {
            return responder.respond_with_error(invalid_params(hint));
        };
        let id = req.session_id.0.to_string();
        let set = if sandbox { self.runtime.set_sandbox(&id, &value.0) } else { self.runtime.set_model(&id, &value.0) };
        // As for the mode: answered once the choice is on disk, or with why it is not.
        let recording = match set {
            Ok(recording) => recording,
            Err(e) => return responder.respond_with_error(to_acp(e)),
        };
        let runtime = self.runtime.clone();
        cx.spawn(async move {
            let sent = match recording.await {
                Ok(()) => responder.respond(SetSessionConfigOptionResponse::new(config_options(&runtime.view(&id)))),
                Err(e) => responder.respond_with_error(to_acp(e)),
            };
            if let Err(e) = sent {
                tracing::debug!("config option response not delivered: {e}");
            }
            Ok(())
        })
    }

    /// Lists on a blocking thread (every log's header, and the titles of changed logs), so
    /// the connection serves other requests meanwhile. The answer is whole (no `nextCursor`),
    /// so a `cursor` is none kin issued: refused, as is a `cwd` that is not absolute.
    pub(super) fn list_sessions(
        &self,
        req: ListSessionsRequest,
        responder: Responder<ListSessionsResponse>,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        if let Some(Err(e)) = req.cwd.as_deref().map(crate::runtime::absolute_cwd) {
            return responder.respond_with_error(to_acp(e));
        }
        if let Some(cursor) = &req.cursor {
            return responder.respond_with_error(invalid_params(format!(
                "kin answers session/list whole and issues no cursors, so {cursor:?} is not one of its own: \
                 send the request without `cursor`"
            )));
        }
        let runtime = self.runtime.clone();
        cx.spawn(async move {
            let listed = tokio::task::spawn_blocking(move || runtime.list_sessions(req.cwd.as_deref())).await;
            let sent = match listed {
                Ok(Err(e)) => responder.respond_with_error(
                    Error::internal_error()
                        .data(format!("{e}; nothing was listed (free what the error names, then list again)")),
                ),
                Ok(Ok(listed)) => {
                    let sessions = listed
                        .into_iter()
                        .filter_map(|(s, title)| {
                            let updated = crate::timefmt::rfc3339(s.modified());
                            let cwd = s.header.cwd?;
                            Some(SessionInfo::new(s.header.id, cwd).updated_at(updated).title(title))
                        })
                        .collect();
                    responder.respond(ListSessionsResponse::new(sessions))
                }
                Err(e) => responder.respond_with_error(Error::internal_error().data(format!("listing sessions: {e}"))),
            };
            if let Err(e) = sent {
                tracing::debug!("session/list response not delivered: {e}");
            }
            Ok(())
        })
    }

    pub(super) fn close_session(
        &self,
        req: CloseSessionRequest,
        responder: Responder<CloseSessionResponse>,
        cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        // The session stops being live now, before the next request is read; the rest of the
        // close runs on its own task.
        let closing = self.runtime.begin_close(&req.session_id.0);
        cx.spawn(async move {
            let closed = match closing {
                Ok(closing) => closing.finish().await,
                Err(e) => Err(e),
            };
            let sent = match closed {
                Ok(()) => responder.respond(CloseSessionResponse::new()),
                Err(e) => responder.respond_with_error(to_acp(e)),
            };
            if let Err(e) = sent {
                tracing::debug!("close response not delivered: {e}");
            }
            Ok(())
        })
    }

    pub(super) fn delete_session(
        &self,
        req: DeleteSessionRequest,
        responder: Responder<DeleteSessionResponse>,
        _cx: &ConnectionTo<Client>,
    ) -> Result<(), Error> {
        match self.runtime.delete_session(&req.session_id.0) {
            Ok(()) => responder.respond(DeleteSessionResponse::new()),
            Err(e) => responder.respond_with_error(to_acp(e)),
        }
    }
}
