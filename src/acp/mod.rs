//! The ACP boundary: the only module that knows agent-client-protocol types. It serves ACP v1
//! over stdio (`transport`: frames of bounded size) with the SDK's builder, hands every request to the runtime and returns at once;
//! prompt turns are awaited on spawned tasks so the dispatch loop never blocks. Permission,
//! file and terminal requests to the client (`client`, `terminal`) are sent from the agents' tasks. Session events reach
//! the client through `tree::Forwarder`, which also shows the agent tree (subagent sessions) to
//! clients that advertised `clientCapabilities.subagents`.

mod child;
mod client;
mod convert;
mod mcp;
mod modes;
pub(crate) mod peer;
pub(crate) mod run;
mod terminal;
mod transport;
mod tree;
pub(crate) mod wire;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, AuthMethod, AuthMethodTerminal, CancelNotification, CloseSessionRequest, CloseSessionResponse,
    CurrentModeUpdate, DeleteSessionRequest, DeleteSessionResponse, ForkSessionRequest, ForkSessionResponse,
    Implementation, InitializeRequest, InitializeResponse, ListSessionsRequest, ListSessionsResponse,
    LoadSessionRequest, LoadSessionResponse, McpCapabilities, NewSessionRequest, NewSessionResponse,
    PromptCapabilities, PromptRequest, PromptResponse, ResumeSessionRequest, ResumeSessionResponse,
    SessionCapabilities, SessionCloseCapabilities, SessionConfigOption, SessionConfigOptionCategory,
    SessionConfigSelectOption, SessionDeleteCapabilities, SessionForkCapabilities, SessionInfo,
    SessionListCapabilities, SessionNotification, SessionResumeCapabilities, SessionUpdate,
    SetSessionConfigOptionRequest, SetSessionConfigOptionResponse, SetSessionModeRequest, SetSessionModeResponse,
    StopReason,
};
use agent_client_protocol::{Agent, Client, ConnectTo, Error, ErrorCode, on_receive_notification, on_receive_request};

use crate::runtime::{ChildObservers, Runtime, RuntimeError, SessionView};
use crate::sandbox::SandboxPolicy;
use tree::{ChildForwarders, Forwarder, Tree};

fn invalid_params(message: impl std::fmt::Display) -> Error {
    Error::new(ErrorCode::from(-32602), format!("Invalid params: {message}"))
}

fn internal(message: impl std::fmt::Display) -> Error {
    Error::new(ErrorCode::from(-32603), format!("Internal error: {message}"))
}

/// The first session parameter kin does not support, as the -32602 that names it.
fn unsupported_params(additional_directories: bool, system_prompt: bool) -> Option<Error> {
    [
        (additional_directories, "additionalDirectories is not supported"),
        (system_prompt, "systemPrompt is not supported"),
    ]
    .into_iter()
    .find(|(given, _)| *given)
    .map(|(_, message)| invalid_params(message))
}

/// The terminal auth method: the editor runs its agent command plus `login` (`kin acp login`).
const LOGIN_METHOD: &str = "kin-login";

/// The auth methods offered: `kin login` in a terminal, to clients that can run one.
fn auth_methods(terminal: bool) -> Vec<AuthMethod> {
    if !terminal {
        return Vec::new();
    }
    let login = AuthMethodTerminal::new(LOGIN_METHOD, "Log in with an API key")
        .description("Runs `kin login`: pick a provider, paste its API key; kin checks it and stores it".to_string())
        .args(vec!["login".to_string()]);
    vec![AuthMethod::Terminal(login)]
}

/// `-32000` for a session whose route has no key: the editor then offers the login.
fn auth_required(missing: &crate::model::MissingKey) -> Error {
    let crate::model::MissingKey { provider, variable } = missing;
    Error::new(
        ErrorCode::AUTH_REQUIRED,
        format!("Authentication required: no API key for {provider}: set {variable} or run `kin login {provider}`"),
    )
    .data(serde_json::json!({"provider": provider, "variable": variable}))
}

fn to_acp(error: RuntimeError) -> Error {
    match error {
        RuntimeError::InvalidParams(m) => invalid_params(m),
        RuntimeError::NotFound(id) => {
            Error::new(ErrorCode::RESOURCE_NOT_FOUND, format!("Resource not found: unknown session: {id}"))
                .data(serde_json::json!({"sessionId": id}))
        }
        RuntimeError::Internal(m) => internal(m),
    }
}

/// The ACP client external agents (`[acp_agents.*]`) are spoken to with.
pub fn external_agents() -> Arc<dyn crate::subagent::external::port::RemoteAgent> {
    Arc::new(child::ExternalAgents)
}

pub use peer::request_frame;

/// Fuzzing entry (see `fuzz/`): runs kin's own checks on a value as `session/new`,
/// `session/prompt` and `session/load` params. Never panics.
#[doc(hidden)]
pub fn fuzz_params(value: &serde_json::Value) {
    if let Ok(prompt) = serde_json::from_value::<PromptRequest>(value.clone()) {
        let _ = convert::prompt_content(&prompt.prompt);
        let _ = crate::session::layout::validate_session_id(&prompt.session_id.0);
    }
    if let Ok(new) = serde_json::from_value::<NewSessionRequest>(value.clone()) {
        let _ = new.cwd.is_absolute();
    }
    if let Ok(load) = serde_json::from_value::<LoadSessionRequest>(value.clone()) {
        let _ = crate::session::layout::validate_session_id(&load.session_id.0);
    }
}

/// The id of the model selector (the model route).
const MODEL_OPTION: &str = "model";
/// The id of the sandbox selector (what commands may touch).
const SANDBOX_OPTION: &str = "sandbox";

/// The `_meta` of a session's `session/new`, `load`, `resume` and `fork` answers: the named
/// agents its delegation tools offer, `{"kin": {"agents": [{name, description}]}}`, so a client
/// can show them.
fn session_meta(view: &SessionView) -> Option<serde_json::Map<String, serde_json::Value>> {
    let agents: Vec<serde_json::Value> = view
        .agents
        .as_ref()?
        .iter()
        .map(|(name, description)| serde_json::json!({"name": name, "description": description}))
        .collect();
    let mut meta = serde_json::Map::new();
    meta.insert("kin".into(), serde_json::json!({ "agents": agents }));
    Some(meta)
}

/// The session's config options: the model selector (the configured choices, the session's
/// current route selected) and the sandbox selector (every policy, the session's selected).
fn config_options(view: &SessionView) -> Vec<SessionConfigOption> {
    let choices: Vec<SessionConfigSelectOption> =
        view.choices.iter().map(|r| SessionConfigSelectOption::new(r.to_string(), r.to_string())).collect();
    let policies: Vec<SessionConfigSelectOption> =
        SandboxPolicy::ALL.iter().map(|p| SessionConfigSelectOption::new(p.id(), p.name())).collect();
    let mut about = "What commands may touch, enforced by the kernel, from the next command on".to_string();
    if view.sandbox.is_sandboxed() && view.unenforced {
        about.push_str(" (this kernel cannot enforce it: commands run unconfined, after the permission questions)");
    }
    vec![
        SessionConfigOption::select(MODEL_OPTION, "Model", view.route.to_string(), choices)
            .category(SessionConfigOptionCategory::Model)
            .description("The model route used from the next turn on".to_string()),
        SessionConfigOption::select(SANDBOX_OPTION, "Sandbox", view.sandbox.id(), policies).description(about),
    ]
}

/// The one-line warning that a prompt's images do not reach the model of the session's route.
fn no_images(runtime: &Runtime, session_id: &str, images: usize, as_notices: bool) -> SessionUpdate {
    let route = runtime.session_model(session_id).map(|r| r.to_string()).unwrap_or_default();
    let what = if images == 1 { "The image" } else { "The images" };
    mcp::notice_update(
        "Images not sent".into(),
        format!(
            "{what} stay in the session, but the model {route} takes no images and sees a placeholder; \
             choose a model that takes images, or set `images = true` for its [providers.*] entry."
        ),
        as_notices,
    )
}

/// After a session's response (so the client knows the session id): offers its slash commands
/// (`available_commands_update`) and tells the user about its MCP servers from now on.
fn after_response(cx: &ConnectionTo<Client>, runtime: &Runtime, id: &str, as_notices: &std::sync::atomic::AtomicBool) {
    tree::notify(cx, id, convert::commands_update(&runtime.slash_commands(id)));
    if let Some(notices) = runtime.take_mcp_notices(id) {
        mcp::forward(cx, id.to_string(), notices, as_notices.load(std::sync::atomic::Ordering::SeqCst));
    }
}

pub(crate) use transport::DEFAULT_MAX_FRAME_BYTES;

pub(crate) use transport::MIN_MAX_FRAME_BYTES;

/// Serves ACP on stdin/stdout until stdin closes or kin gets SIGTERM, then shuts the runtime
/// down (both alike: running turns end `disposed`, queued messages stay pending on disk). A
/// frame longer than `max_frame_bytes` is answered with an error and dropped (see `transport`).
pub async fn serve_stdio(runtime: Arc<Runtime>, max_frame_bytes: usize) -> anyhow::Result<()> {
    serve_until(runtime, transport::stdio(max_frame_bytes), terminated()).await
}

/// Resolves when kin gets SIGTERM (never, if the handler cannot be installed: kin then dies of
/// it as it would without one, and loses nothing accepted, which is on disk already).
async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut sigterm) => {
            sigterm.recv().await;
            tracing::info!("SIGTERM: shutting down as when stdin closes; queued messages stay pending on disk");
        }
        Err(e) => {
            tracing::warn!("cannot handle SIGTERM ({e}); it will end kin without a clean shutdown");
            std::future::pending::<()>().await;
        }
    }
}

/// Serves ACP over `transport` until it closes, then shuts the runtime down.
async fn serve(runtime: Arc<Runtime>, transport: impl ConnectTo<Agent>) -> anyhow::Result<()> {
    serve_until(runtime, transport, std::future::pending()).await
}

/// `serve`, also ending (as if the transport had closed) when `stop` resolves.
async fn serve_until(
    runtime: Arc<Runtime>,
    transport: impl ConnectTo<Agent>,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let rt_init = runtime.clone();
    let rt_new = runtime.clone();
    let rt_prompt = runtime.clone();
    let rt_cancel = runtime.clone();
    let rt_load = runtime.clone();
    let rt_list = runtime.clone();
    let rt_mode = runtime.clone();
    let rt_config = runtime.clone();
    let rt_resume = runtime.clone();
    let rt_close = runtime.clone();
    let rt_fork = runtime.clone();
    let rt_delete = runtime.clone();
    let agents = Arc::new(Tree::new(runtime.models()));
    let (tree_init, tree_new, tree_load) = (agents.clone(), agents.clone(), agents.clone());
    let (tree_resume, tree_fork) = (agents.clone(), agents);
    // Whether the client shows `notice` updates (`clientCapabilities.session.notices`).
    let notices = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (notices_init, notices_new, notices_load) = (notices.clone(), notices.clone(), notices.clone());
    let notices_prompt = notices.clone();
    let (notices_resume, notices_fork) = (notices.clone(), notices);
    let connection = Agent
        .v1()
        .name("kin")
        .on_receive_request(
            async move |req: InitializeRequest, responder, cx: ConnectionTo<Client>| {
                // Permission requests always go to the client; files only when it offers them.
                let fs = &req.client_capabilities.fs;
                // The agent tree is shown only to clients that advertised subagent sessions.
                let subagents = req.client_capabilities.subagents.is_some();
                let parent_of: Option<client::ParentOf> = subagents.then(|| {
                    let runtime = Arc::downgrade(&rt_init);
                    Arc::new(move |id: &str| runtime.upgrade().and_then(|rt| rt.parent_of(id))) as client::ParentOf
                });
                let terminal = req.client_capabilities.terminal;
                let mut link = client::link(&cx, fs.read_text_file, fs.write_text_file, terminal, parent_of);
                tree_init.set_enabled(subagents);
                if subagents {
                    let tools = rt_init.tools().clone();
                    let children = ChildForwarders { cx: cx.clone(), tree: tree_init.clone(), tools };
                    link.children = Some(Arc::new(children) as Arc<dyn ChildObservers>);
                }
                rt_init.connect_client(link);
                let takes_notices = req.client_capabilities.session.as_ref().is_some_and(|s| s.notices.is_some());
                notices_init.store(takes_notices, std::sync::atomic::Ordering::SeqCst);
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
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: NewSessionRequest, responder, cx: ConnectionTo<Client>| {
                if let Some(e) = unsupported_params(!req.additional_directories.is_empty(), req.system_prompt.is_some())
                {
                    return responder.respond_with_error(e);
                }
                if let Some(missing) = rt_new.missing_key() {
                    return responder.respond_with_error(auth_required(&missing));
                }
                let forwarder = Arc::new(Forwarder::new(cx.clone(), tree_new.clone(), rt_new.tools().clone()));
                match rt_new.new_session_with(&req.cwd, forwarder, mcp::specs(&req.mcp_servers)) {
                    Ok(view) => {
                        let id = view.id.clone();
                        let sent = responder.respond(
                            NewSessionResponse::new(id.clone())
                                .modes(modes::state(view.mode))
                                .config_options(config_options(&view))
                                .meta(session_meta(&view)),
                        );
                        after_response(&cx, &rt_new, &id, &notices_new);
                        sent
                    }
                    Err(e) => responder.respond_with_error(to_acp(e)),
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: PromptRequest, responder, cx: ConnectionTo<Client>| {
                let content = match convert::prompt_content(&req.prompt) {
                    Ok(content) => content,
                    Err(e) => return responder.respond_with_error(invalid_params(e)),
                };
                let images = content.iter().filter(|b| crate::tools::image::is_image(b)).count();
                let turn = match rt_prompt.prompt(&req.session_id.0, content) {
                    Ok(turn) => turn,
                    Err(e) => return responder.respond_with_error(to_acp(e)),
                };
                if images > 0 && !rt_prompt.takes_images(&req.session_id.0) {
                    let notice =
                        no_images(&rt_prompt, &req.session_id.0, images, notices_prompt.load(Ordering::SeqCst));
                    tree::notify(&cx, &req.session_id.0, notice);
                }
                let turn = match turn {
                    crate::runtime::Prompted::Turn(turn) => turn,
                    crate::runtime::Prompted::Answer(answer) => {
                        let (session, to) = (req.session_id.0.to_string(), cx.clone());
                        return cx.spawn(async move {
                            let text = answer.await.unwrap_or_else(|_| "The command did not finish.".into());
                            tree::notify(&to, &session, convert::agent_text(&text));
                            if let Err(e) = responder.respond(PromptResponse::new(StopReason::EndTurn)) {
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
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            async move |n: CancelNotification, _cx| {
                rt_cancel.cancel(&n.session_id.0);
                Ok(())
            },
            on_receive_notification!(),
        )
        .on_receive_request(
            async move |req: LoadSessionRequest, responder, cx: ConnectionTo<Client>| {
                let runtime = rt_load.clone();
                let notices = notices_load.clone();
                let agents = tree_load.clone();
                let forwarder = Arc::new(Forwarder::new(cx.clone(), agents.clone(), runtime.tools().clone()));
                cx.spawn({
                    let cx = cx.clone();
                    async move {
                        let id = req.session_id.0.to_string();
                        match runtime.load_session(&id, forwarder.clone(), mcp::specs(&req.mcp_servers)).await {
                            Ok(crate::runtime::Loaded { events, view }) => {
                                forwarder.count(&events);
                                let tools = runtime.tools();
                                let header = runtime.store().header(&id).ok();
                                let cwd = header.as_ref().map(convert::cwd_of).unwrap_or_default();
                                for update in
                                    events.iter().flat_map(|e| convert::replay_updates(&e.body(), tools, &cwd))
                                {
                                    tree::notify(&cx, &id, update);
                                }
                                // Shared with the live session: let go before it appends.
                                drop(events);
                                // The agent tree: children replayed before the response, the
                                // continuing ones re-announced after it.
                                let children =
                                    if agents.enabled() { tree::stored_tree(&runtime, &id) } else { Vec::new() };
                                tree::replay(&cx, tools, &children);
                                let _ = responder.respond(
                                    LoadSessionResponse::new()
                                        .modes(modes::state(view.mode))
                                        .config_options(config_options(&view))
                                        .meta(session_meta(&view)),
                                );
                                after_response(&cx, &runtime, &id, &notices);
                                tree::reannounce(&cx, &children);
                                runtime.run_restored(&id).await;
                            }
                            Err(e) => {
                                let _ = responder.respond_with_error(to_acp(e));
                            }
                        }
                        Ok(())
                    }
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: SetSessionModeRequest, responder, cx: ConnectionTo<Client>| {
                let mode = match modes::parse(&req.mode_id.0) {
                    Ok(mode) => mode,
                    Err(e) => return responder.respond_with_error(invalid_params(e)),
                };
                if let Err(e) = rt_mode.set_permission_mode(&req.session_id.0, mode) {
                    return responder.respond_with_error(to_acp(e));
                }
                let update = SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new(mode.id()));
                if let Err(e) = cx.send_notification(SessionNotification::new(req.session_id.clone(), update)) {
                    tracing::debug!("dropping a mode update: {e}");
                }
                responder.respond(SetSessionModeResponse::new())
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: SetSessionConfigOptionRequest, responder, _cx| {
                let option = req.config_id.0.as_ref();
                let hint = match option {
                    MODEL_OPTION => "the model option takes a route id such as deepseek/deepseek-v4-pro".to_string(),
                    SANDBOX_OPTION => format!("the sandbox option takes one of {}", SandboxPolicy::valid_ids()),
                    other => {
                        return responder.respond_with_error(invalid_params(format!(
                            "unknown config option {other}; kin offers \"{MODEL_OPTION}\" and \"{SANDBOX_OPTION}\""
                        )));
                    }
                };
                let Some(value) = req.value.as_value_id() else {
                    return responder.respond_with_error(invalid_params(hint));
                };
                let id = &req.session_id.0;
                let set = match option {
                    SANDBOX_OPTION => rt_config.set_sandbox(id, &value.0).map(|_| ()),
                    _ => rt_config.set_model(id, &value.0).map(|_| ()),
                };
                match set {
                    Ok(()) => {
                        responder.respond(SetSessionConfigOptionResponse::new(config_options(&rt_config.view(id))))
                    }
                    Err(e) => responder.respond_with_error(to_acp(e)),
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: ListSessionsRequest, responder, _cx| {
                let sessions = rt_list
                    .list_sessions(req.cwd.as_deref())
                    .into_iter()
                    .filter_map(|s| {
                        let cwd = s.header.cwd.clone()?;
                        let info = SessionInfo::new(s.header.id.clone(), cwd)
                            .updated_at(crate::timefmt::rfc3339(s.modified))
                            .title(rt_list.session_title(&s));
                        Some(info)
                    })
                    .collect();
                responder.respond(ListSessionsResponse::new(sessions))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: ResumeSessionRequest, responder, cx: ConnectionTo<Client>| {
                if let Some(e) = unsupported_params(!req.additional_directories.is_empty(), false) {
                    return responder.respond_with_error(e);
                }
                let runtime = rt_resume.clone();
                let notices = notices_resume.clone();
                let agents = tree_resume.clone();
                let forwarder = Arc::new(Forwarder::new(cx.clone(), agents.clone(), runtime.tools().clone()));
                cx.spawn({
                    let cx = cx.clone();
                    async move {
                        let id = req.session_id.0.to_string();
                        match runtime.resume_session(&id, forwarder.clone(), mcp::specs(&req.mcp_servers)).await {
                            Ok(crate::runtime::Loaded { events, view }) => {
                                forwarder.count(&events);
                                drop(events);
                                let _ = responder.respond(
                                    ResumeSessionResponse::new()
                                        .modes(modes::state(view.mode))
                                        .config_options(config_options(&view))
                                        .meta(session_meta(&view)),
                                );
                                after_response(&cx, &runtime, &id, &notices);
                                if agents.enabled() {
                                    tree::reannounce(&cx, &tree::stored_tree(&runtime, &id));
                                }
                                runtime.run_restored(&id).await;
                            }
                            Err(e) => {
                                let _ = responder.respond_with_error(to_acp(e));
                            }
                        }
                        Ok(())
                    }
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: CloseSessionRequest, responder, cx: ConnectionTo<Client>| {
                let runtime = rt_close.clone();
                cx.spawn(async move {
                    let sent = match runtime.close_session(&req.session_id.0).await {
                        Ok(()) => responder.respond(CloseSessionResponse::new()),
                        Err(e) => responder.respond_with_error(to_acp(e)),
                    };
                    if let Err(e) = sent {
                        tracing::debug!("close response not delivered: {e}");
                    }
                    Ok(())
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: ForkSessionRequest, responder, cx: ConnectionTo<Client>| {
                if let Some(e) = unsupported_params(!req.additional_directories.is_empty(), req.system_prompt.is_some())
                {
                    return responder.respond_with_error(e);
                }
                let forwarder = Arc::new(Forwarder::new(cx.clone(), tree_fork.clone(), rt_fork.tools().clone()));
                match rt_fork.fork_session(&req.session_id.0, &req.cwd, forwarder, mcp::specs(&req.mcp_servers)) {
                    Ok(view) => {
                        let id = view.id.clone();
                        let sent = responder.respond(
                            ForkSessionResponse::new(id.clone())
                                .modes(modes::state(view.mode))
                                .config_options(config_options(&view))
                                .meta(session_meta(&view)),
                        );
                        after_response(&cx, &rt_fork, &id, &notices_fork);
                        sent
                    }
                    Err(e) => responder.respond_with_error(to_acp(e)),
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |req: DeleteSessionRequest, responder, _cx| match rt_delete.delete_session(&req.session_id.0) {
                Ok(()) => responder.respond(DeleteSessionResponse::new()),
                Err(e) => responder.respond_with_error(to_acp(e)),
            },
            on_receive_request!(),
        )
        .connect_to(transport);
    let result = tokio::select! {
        result = connection => result,
        () = stop => Ok(()),
    };
    runtime.shutdown().await;
    result.map_err(|e| anyhow::anyhow!("ACP connection failed: {e}"))
}
