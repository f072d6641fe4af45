//! The ACP boundary: the only module that knows agent-client-protocol types. It serves ACP v1
//! over stdio (`transport`: frames of bounded size) with the SDK's builder, hands every request to the runtime and returns at once;
//! prompt turns are awaited on spawned tasks so the dispatch loop never blocks. Permission,
//! file and terminal requests to the client (`client`, `terminal`) are sent from the agents' tasks. Session events reach
//! the client through `tree::Forwarder`, which also shows the agent tree (subagent sessions) to
//! clients that advertised `clientCapabilities.subagents`.

mod child;
mod client;
mod convert;
mod handlers;
mod mcp;
mod modes;
pub(crate) mod peer;
pub(crate) mod run;
mod terminal;
mod transport;
mod tree;
mod unreadable;
pub(crate) mod wire;

use std::sync::Arc;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AuthMethod, AuthMethodTerminal, CancelNotification, CloseSessionRequest, DeleteSessionRequest, ForkSessionRequest,
    InitializeRequest, ListSessionsRequest, LoadSessionRequest, NewSessionRequest, PromptRequest, ResumeSessionRequest,
    SessionConfigOption, SessionConfigOptionCategory, SessionConfigSelectOption, SessionUpdate,
    SetSessionConfigOptionRequest, SetSessionModeRequest,
};
use agent_client_protocol::{Agent, Client, ConnectTo, Error, ErrorCode, on_receive_notification, on_receive_request};

use crate::runtime::{Runtime, RuntimeError, SessionView};
use crate::sandbox::SandboxPolicy;
use handlers::AcpServer;

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

/// For a config option id, whether it is the sandbox option and what a value of it is (said to
/// a client that sent one that is not); `Err` names an option kin does not offer.
fn option_values(config_id: &str) -> Result<(bool, String), String> {
    match config_id {
        MODEL_OPTION => Ok((false, "the model option takes a route id such as deepseek/deepseek-v4-pro".to_string())),
        SANDBOX_OPTION => Ok((true, format!("the sandbox option takes one of {}", SandboxPolicy::valid_ids()))),
        // The id quoted as JSON and cut: a client may send anything up to a frame's size.
        other => Err(format!(
            "unknown config option {}; kin offers \"{MODEL_OPTION}\" and \"{SANDBOX_OPTION}\"",
            unreadable::quoted(other)
        )),
    }
}

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
    let what = if images == 1 { "The image stays" } else { "The images stay" };
    mcp::notice_update(
        "Images not sent".into(),
        format!(
            "{what} in the session, but the model {route} takes no images and sees a placeholder; \
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

pub(crate) use transport::{MAX_MAX_FRAME_BYTES, MIN_MAX_FRAME_BYTES};

/// Serves ACP on stdin/stdout until stdin closes or kin gets SIGTERM (or SIGHUP, SIGINT: a
/// closed terminal or a Ctrl-C end kin as cleanly, its children with it), then shuts the runtime
/// down (both alike: the requests already read are answered first, running turns end
/// `disposed` and their prompts are answered `cancelled`, queued messages stay pending on disk). A
/// frame longer than `max_frame_bytes` is answered with an error and dropped (see `transport`).
pub async fn serve_stdio(runtime: Arc<Runtime>, max_frame_bytes: usize) -> anyhow::Result<()> {
    let turns = runtime.clone();
    let (lines, output) = transport::stdio(max_frame_bytes, move || turns.stop_turns());
    let stop = async {
        let signal = terminated().await;
        output.answer_before_the_end(signal).await;
    };
    let served = serve_until(runtime, lines, stop).await;
    output.flush().await;
    served
}

/// Resolves with the signal's name when kin gets SIGTERM, SIGHUP or SIGINT (one whose handler
/// cannot be installed is never heard: kin then dies of it as it would without one, and loses
/// nothing accepted, which is on disk already).
async fn terminated() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let heard = |kind: SignalKind, name: &'static str| async move {
        match signal(kind) {
            Ok(mut stream) => {
                stream.recv().await;
                name
            }
            Err(e) => {
                tracing::warn!("cannot handle {name} ({e}); it will end kin without a clean shutdown");
                std::future::pending().await
            }
        }
    };
    let name = tokio::select! {
        name = heard(SignalKind::terminate(), "SIGTERM") => name,
        name = heard(SignalKind::hangup(), "SIGHUP") => name,
        name = heard(SignalKind::interrupt(), "SIGINT") => name,
    };
    tracing::info!("{name}: shutting down as when stdin closes; queued messages stay pending on disk");
    name
}

/// Serves ACP over `transport` until it closes, then shuts the runtime down.
async fn serve(runtime: Arc<Runtime>, transport: impl ConnectTo<Agent>) -> anyhow::Result<()> {
    serve_until(runtime, transport, std::future::pending()).await
}

/// `$builder` with `AcpServer::$method` (on a copy of `$server`) as the handler of `$req`.
macro_rules! on_request {
    ($builder:expr, $server:expr, $req:ty, $method:ident) => {{
        let server = $server.clone();
        $builder.on_receive_request(
            async move |req: $req, responder, cx: ConnectionTo<Client>| server.$method(req, responder, &cx),
            on_receive_request!(),
        )
    }};
}

/// `serve`, also ending (as if the transport had closed) when `stop` resolves.
async fn serve_until(
    runtime: Arc<Runtime>,
    transport: impl ConnectTo<Agent>,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let server = AcpServer::new(runtime.clone());
    let kin = Agent.v1().name("kin");
    let kin = on_request!(kin, server, InitializeRequest, initialize);
    let kin = on_request!(kin, server, NewSessionRequest, new_session);
    let kin = on_request!(kin, server, PromptRequest, prompt);
    let cancel = server.clone();
    let kin = kin.on_receive_notification(
        async move |n: CancelNotification, _cx| {
            cancel.cancel(&n);
            Ok(())
        },
        on_receive_notification!(),
    );
    let kin = on_request!(kin, server, LoadSessionRequest, load_session);
    let kin = on_request!(kin, server, SetSessionModeRequest, set_mode);
    let kin = on_request!(kin, server, SetSessionConfigOptionRequest, set_config_option);
    let kin = on_request!(kin, server, ListSessionsRequest, list_sessions);
    let kin = on_request!(kin, server, ResumeSessionRequest, resume_session);
    let kin = on_request!(kin, server, CloseSessionRequest, close_session);
    let kin = on_request!(kin, server, ForkSessionRequest, fork_session);
    let kin = on_request!(kin, server, DeleteSessionRequest, delete_session);
    let connection = kin.connect_to(transport);
    let result = tokio::select! {
        result = connection => result,
        () = stop => Ok(()),
    };
    runtime.shutdown().await;
    result.map_err(|e| anyhow::anyhow!("ACP connection failed: {e}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agent_client_protocol::Channel;
    use agent_client_protocol::schema::ProtocolVersion;

    use super::*;
    use crate::session::SessionHeader;

    /// `session/list` lists on a blocking thread: while a listing waits (here for the session
    /// query's cache, which the test holds), the connection answers other requests, and the
    /// listing answers once the cache is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn other_requests_are_answered_while_a_listing_waits() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::for_tests(dir.path());
        let cwd = dir.path().join("project");
        std::fs::create_dir(&cwd).unwrap();
        let stored = "5e2d3c1a-0000-4000-8000-0000000000aa";
        let header = SessionHeader::new(stored, 0, Some(cwd.display().to_string()));
        runtime.store().create(header).unwrap().flush().unwrap();
        let held = runtime.query().source().hold_cache();
        let (agent_end, client_end) = Channel::duplex();
        let server = tokio::spawn(serve(runtime.clone(), agent_end));
        let (answered, other_answered) = tokio::sync::oneshot::channel();
        let client = Client.v1().name("fence").connect_with(client_end, async move |cx: ConnectionTo<Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1)).block_task().await?;
            let mut listing = Box::pin(cx.send_request(ListSessionsRequest::new()).block_task());
            // Answered while the listing waits (a listing on the message loop would hold them,
            // and the test would end at the timeout instead).
            let others = async {
                let refused = cx.send_request(ListSessionsRequest::new().cursor("not-issued")).block_task().await;
                let created = cx.send_request(NewSessionRequest::new(cwd.clone())).block_task().await;
                (refused, created)
            };
            let (refused, created) = tokio::time::timeout(Duration::from_secs(60), others)
                .await
                .expect("other requests are answered while a listing waits");
            assert_eq!(refused.unwrap_err().code, ErrorCode::from(-32602), "a cursor kin never issued");
            let created = created.expect("a session is created while a listing waits");
            assert!(futures::poll!(&mut listing).is_pending(), "the listing waits for the held cache");
            answered.send(()).unwrap();
            let listed = listing.await?;
            let ids: Vec<String> = listed.sessions.iter().map(|s| s.session_id.0.to_string()).collect();
            assert!(ids.contains(&stored.to_string()), "{ids:?}");
            Ok(created)
        });
        let release = async move {
            other_answered.await.unwrap();
            drop(held);
        };
        let (created, ()) = tokio::join!(client, release);
        created.unwrap();
        server.abort();
    }
}
